r"""Decisions that change what crosses the wire, taken identically by every rank.

Whether an exchange point runs pre-aggregated, or reuses a cached result instead of
exchanging, changes which collectives a rank calls.  A rank that decided differently from
its peers would wait in a collective nobody else joins, so every such decision is the
minimum over ranks of each rank's local answer (one small all-reduce).
"""
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .errors import guarded

__all__ = ["all_agree", "Agreement"]


def all_agree(local_ok: bool, group: Optional[Any] = None, what: str = "decision",
              timeout: Optional[Any] = None) -> bool:
    r"""``True`` iff :obj:`local_ok` holds on every rank of :obj:`group` (one all-reduce).

    Every rank of the group must call it at the same point; :obj:`timeout` (the group's) is
    named in the error if a peer does not come.
    """
    return all_agree_each((local_ok, ), group, what, timeout)[0]


def all_agree_each(local_oks: Sequence[bool], group: Optional[Any] = None,
                   what: str = "decision", timeout: Optional[Any] = None) -> Tuple[bool, ...]:
    r"""For each of :obj:`local_oks`, whether it holds on every rank (one all-reduce for
    all of them); see :func:`all_agree`."""
    ok = torch.tensor([1 if v else 0 for v in local_oks], dtype=torch.int32)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        with guarded(what, rank, [r for r in range(world) if r != rank], timeout):
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    return tuple(int(v) == 1 for v in ok)


class Agreement:
    r"""Per-point decisions agreed once (the first time a point is seen), then held.

    Args:
        group (ProcessGroup, optional): Group of the agreement all-reduce.
        what (str): What is decided, for error messages.
        timeout (float or timedelta, optional): The group's timeout, named in errors.
    """

    def __init__(self, group: Optional[Any] = None, what: str = "decision",
                 timeout: Optional[Any] = None) -> None:
        self.group = group
        self.what = what
        self.timeout = timeout
        self._decisions: Dict[str, bool] = {}

    def decide(self, point: str, local_ok: bool, revocable: bool = False) -> bool:
        r"""The decision of :obj:`point`: on the first call, whether every rank's
        :obj:`local_ok` holds; later calls return it without communicating.

        With :obj:`revocable`, a held ``True`` that a rank's :obj:`local_ok` no longer allows
        is agreed again (``False`` from then on).  Every rank must then lose it at the same
        call, as code that runs alike on every rank does (a hook added on every rank); a rank
        that alone loses it calls a collective its peers do not, which ends in a
        :class:`~lightning_fullgraph.engine.CollectiveError` within the group's timeout on
        every rank -- never in a rank acting on a decision its peers do not share."""
        decided = self._decisions.get(point)
        if decided is None or (revocable and decided and not local_ok):
            decided = self._decisions[point] = all_agree(
                local_ok, self.group, f"{self.what} agreement for '{point}'", self.timeout)
        return decided

    def known(self, point: str) -> Optional[bool]:
        return self._decisions.get(point)

    def clear(self) -> None:
        self._decisions.clear()
