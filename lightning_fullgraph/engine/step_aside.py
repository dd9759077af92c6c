r"""Stages that step aside when they do not shorten the training step.

A reduction (boundary sampling, the halo cache, a lossy codec, the asynchronous pipeline)
sends fewer bytes, but it also costs work: selecting rows, encoding, decoding, extra
collectives.  Where the link is fast or the rows few, that work costs more than the link
time it saves, and the step gets *slower* than the exact exchange (measured on the emulated
cluster: README, "Time on an emulated cluster").  :class:`StepAside` measures instead of predicting:

1. after :obj:`warmup` training steps (one-off costs: normalization degrees, kept
   aggregations, a cache's first full send), it runs each *arm* (the policy with some of its
   stages removed, down to the exact exchange) for :obj:`steps` consecutive steps and times
   them, the first step of each arm untimed (a switch's transition: a pipeline's first
   synchronous exchange, a cache catching up);
2. every rank all-reduces its per-arm median step times (maximum over ranks: the step ends
   when its slowest rank does), so every rank takes the same decision from the same figures
   (a rank that decided differently would wait in a collective no peer joins);
3. it keeps the arm with the shortest time, a stage counting only when it saves at least
   :obj:`margin` of the step (a lossy stage that does not pay is not worth its error).

The aggregation mode is tried too, as a stage named after it (``"pre"``, ``"hybrid"``,
``"auto"``): left out, every layer runs post-aggregated.  Both are exact, but pre and hybrid
send fewer rows at the cost of more, smaller operations (the senders' partial sums, adding them
in), and where the rows are already small (a 2-bit codec) or few that work can cost more than
the link time it saves (on the emulated cluster, whose machines are CPU quotas that charge
OpenMP's spinning threads as work, hybrid with int2-compact took 1.10-1.14x the step of post
with it; 1.04x with ``OMP_WAIT_POLICY=PASSIVE``).

Sending each exchange's two directions at once on two groups (``ExchangeConfig(duplex=True)``)
is tried too, as a stage named ``"duplex"``: left out, each exchange is one collective again.
It is exact either way; it pays where the exchange is bandwidth-bound (on the emulated
cluster exact post's GraphSAGE step took 0.86x with it, and step aside kept it) and costs a
second collective where it is latency-bound (GCN's step there: 1.02x with it; step aside left
it out).

Arms with a stage removed are exact in that stage, so a trial never trains less exactly
than the configured policy (an aggregation of an unchanged input that the static-input memo
kept, computed once under the codec, stays as it was computed).  The decision is a function
of timings: two runs of the same script may decide differently (it is logged, and
checkpointed with the random states, so a resumed run keeps it; a trial interrupted by a
checkpoint goes on where it stopped, running the stages the uninterrupted run would at each
step).  On by default (``ExchangeConfig(step_aside=True)``: ``FullGraphStrategy``,
``setup_fullgraph``, ``lightning-fullgraph train`` and ``FullGraphEngine`` alike);
``step_aside=False`` or ``--no-step-aside`` keeps the configured policy throughout.
"""
import itertools
import logging
import math
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from .errors import guarded
from .policy import ExchangePolicy

__all__ = ["StepAside"]

log = logging.getLogger(__name__)
_clock = time.perf_counter  # the step clock (tests replace it)


class StepAside:
    r"""Trial of an exchange policy's stages against the step time; keeps those that pay.

    Args:
        warmup (int): Training steps before the trial. (default: :obj:`2`)
        steps (int): Consecutive steps each arm runs; the first is not timed.
            (default: :obj:`3`)
        margin (float): Share of the step a stage must save to be kept. (default: :obj:`0.03`)
        every (int): Steps after a decision when the trial runs again (without warm-up), for
            stages whose gain changes as training goes on (a cache skips more rows as the
            model settles); ``0``: decide once. (default: :obj:`0`)
    """

    def __init__(self, warmup: int = 2, steps: int = 3, margin: float = 0.03,
                 every: int = 0) -> None:
        if int(warmup) < 0 or int(steps) < 2 or not 0.0 <= float(margin) < 1.0 \
                or int(every) < 0:
            raise ValueError(f"StepAside: need warmup >= 0, steps >= 2, 0 <= margin < 1 and "
                             f"every >= 0, got warmup={warmup}, steps={steps}, "
                             f"margin={margin}, every={every}")
        self.warmup, self.steps, self.margin = int(warmup), int(steps), float(margin)
        self.every = int(every)
        self.arms: List[Tuple[str, ...]] = []
        # The chosen stages, the arms, their times and the first step that runs the choice.
        self.decision: Optional[Dict[str, Any]] = None
        self._ticks = 0
        self._origin: Optional[int] = self.warmup  # tick of the trial's first arm (None: decided)
        self._decided_at = 0
        self._last: Optional[float] = None
        self._times: Dict[int, List[float]] = {}

    @classmethod
    def of(cls, value: Union[None, bool, "StepAside"]) -> Optional["StepAside"]:
        r"""From ``None``/``False`` (off), ``True`` (the defaults) or a :class:`StepAside`."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, StepAside):
            return value
        raise TypeError(f"step_aside takes a bool or a StepAside, got {type(value).__name__}")

    # -- the arms ------------------------------------------------------------------------
    def bind(self, stages: Sequence[str]) -> bool:
        r"""Sets the arms for :obj:`stages` (the aggregation mode and the policy's stages);
        ``False`` if there is nothing to try (no stage)."""
        stages = tuple(stages)
        if not stages:
            self.arms = []
            return False
        if len(stages) <= 2:  # every subset, the full policy first
            arms = [kept for n in range(len(stages), -1, -1)
                    for kept in itertools.combinations(stages, n)]
        else:  # the full policy, each stage alone left out, the exact exchange
            arms = [stages] + [tuple(s for s in stages if s != gone) for gone in stages] + [()]
        self.arms = arms
        return True

    @property
    def trial_steps(self) -> int:
        r"""Training steps that run before the decision (the first step, the warm-up and
        the arms)."""
        return 1 + self.warmup + len(self.arms) * self.steps

    @property
    def done(self) -> bool:
        return self.decision is not None

    @property
    def started(self) -> bool:
        r"""Whether a training step was seen or a decision taken (the arms are then fixed)."""
        return self._ticks > 0 or self.decision is not None

    # -- driven by the engine, once per training step ----------------------------------------
    def tick(self, group: Optional[Any] = None,
             timeout: Optional[Any] = None) -> Optional[Tuple[str, ...]]:
        r"""Marks the start of a training step (every rank at the same point).  Returns the
        stages to run from this step on when they change, else ``None``."""
        if not self.arms:
            return None
        if self._origin is None:  # decided: run again after `every` steps, or never
            if not self.every or self._ticks - self._decided_at < self.every:
                self._ticks += 1
                return None
            self._origin, self._times, self._last = self._ticks, {}, None
        now = _clock()
        index = self._ticks - self._origin - 1  # the step that just ended, within the trial
        if index >= 0 and self._last is not None and index % self.steps != 0:
            self._times.setdefault(index // self.steps, []).append(now - self._last)
        self._last = now
        start = self._ticks - self._origin  # the step that starts now, within the trial
        self._ticks += 1
        if start < 0:
            return None
        if start < len(self.arms) * self.steps:
            return self.arms[start // self.steps] if start % self.steps == 0 else None
        return self._decide(group, timeout)

    def _decide(self, group: Optional[Any], timeout: Optional[Any]) -> Tuple[str, ...]:
        # An arm with no timed step (its only one was in progress at a checkpoint a run
        # resumed from) is not chosen.
        medians = torch.tensor([statistics.median(self._times.get(i, [float("inf")]))
                                for i in range(len(self.arms))], dtype=torch.float64)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            with guarded("step-aside decision", rank, [r for r in range(world) if r != rank],
                         timeout):
                dist.all_reduce(medians, op=dist.ReduceOp.MAX, group=group)
        seconds = medians.tolist()
        scores = [t * (1.0 + self.margin * len(arm)) for t, arm in zip(seconds, self.arms)]
        best = min(range(len(self.arms)), key=lambda i: (scores[i], -len(self.arms[i])))
        chosen = self.arms[best]
        self._origin, self._decided_at = None, self._ticks
        # "step": the first training step that runs the chosen stages, counted from the first
        # step this object saw (0; the first step is not ticked, so this tick's count is the
        # index of the step that starts now), for readers that time the steady state apart.
        # An arm never timed is ``None`` in the decision (it goes to JSON summaries and
        # checkpoints, where an infinite float is not valid JSON).
        self.decision = {"stages": list(chosen), "arms": [list(a) for a in self.arms],
                         "seconds": [t if math.isfinite(t) else None for t in seconds],
                         "step": self._ticks}
        left = [s for s in self.arms[0] if s not in chosen]
        log.info("step aside: %s (median step %s)",
                 f"kept {', '.join(chosen) or 'nothing (exact post exchange)'}"
                 + (f", left out {', '.join(left)}" if left else ""),
                 ", ".join(f"{'+'.join(a) or 'exact post'} "
                           + (f"{t * 1e3:.1f} ms" if math.isfinite(t) else "not timed")
                           for a, t in zip(self.arms, seconds)))
        return chosen

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        r"""The decision and where the trial stands: a resumed run goes on with the arm
        that was running (the same stages at the same steps as the run that was not
        interrupted, so an exact one resumes bit for bit), the steps timed so far kept."""
        return {"decision": self.decision, "ticks": self._ticks, "origin": self._origin,
                "decided_at": self._decided_at,
                "times": [[i, list(t)] for i, t in sorted(self._times.items())]}

    def load_state_dict(self, state: Dict[str, Any]) -> Optional[Tuple[str, ...]]:
        r"""Restores the decision and the trial's progress; returns the stages to run now
        (the decision's, or the running arm's; ``None``: the configured ones)."""
        self.decision = state.get("decision")
        self._last = None  # the step in progress at the checkpoint is not timed
        if "ticks" not in state:  # a decision saved alone: a trial not finished starts again
            self._ticks, self._times, self._decided_at = 0, {}, 0
            self._origin = None if self.decision is not None else self.warmup
            return tuple(self.decision["stages"]) if self.decision is not None else None
        self._ticks, self._origin = int(state["ticks"]), state["origin"]
        self._decided_at = int(state["decided_at"])
        self._times = {int(i): [float(x) for x in t] for i, t in state["times"]}
        if self._origin is not None and self.arms:
            started = self._ticks - 1 - self._origin  # the step in progress, in the trial
            if 0 <= started < len(self.arms) * self.steps:
                return tuple(self.arms[started // self.steps])
            if started < 0 and self.decision is None:
                return None
        return tuple(self.decision["stages"]) if self.decision is not None else None

    def __repr__(self) -> str:
        return (f"StepAside(warmup={self.warmup}, steps={self.steps}, margin={self.margin}, "
                f"every={self.every})")


def policy_with(policy: ExchangePolicy, stages: Sequence[str]) -> ExchangePolicy:
    r""":obj:`policy` keeping only :obj:`stages` of its own."""
    return policy.without(*[s for s in policy.stages() if s not in stages])
