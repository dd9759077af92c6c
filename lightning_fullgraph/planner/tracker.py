r"""Predictions for a running engine, epoch by epoch (what the
:class:`~lightning_fullgraph.callbacks.CommunicationMonitor` logs).

A :class:`PredictionTracker` is created at fit start from the engine's plans (this rank's
:class:`~.counts.RankCounts`) and either a profile made before fit
(:func:`~.profile.profile_model`) or, without one, an :class:`~.profile.ExchangeRecorder` that
records the exchange calls of the run's first steps until they repeat.  It counts the training
steps and evaluation forwards of every epoch and, at its end, predicts this rank's bytes and,
with a link model, its view of the seconds of every exchange.  It adds no collective: the
per-exchange seconds are returned as a vector for the caller to reduce with ``MAX`` together
with what it reduces anyway (every rank's vector has the same length and order, because every
rank makes the same exchange calls).

It also fits the link to the run (:func:`~.fit.fit_link`): per epoch it hands the caller a
vector of this rank's measured calls, bytes and negated seconds per exchange point, reduced
with ``MAX`` in the same all-reduce, and from the reduced vectors of the
steady-state epochs it refits :attr:`PredictionTracker.fitted` -- the link as training meets
it, which ``lightning-fullgraph plan --link`` can read.
"""
import math
import warnings
from collections import deque
from dataclasses import replace
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..engine.errors import guarded
from ..engine.stats import MARKS, CommStats
from .counts import RankCounts
from .fit import fit_link
from .link import LinkModel
from .model import CommunicationModel
from .profile import ExchangeCall, ExchangeProfile, ExchangeRecorder

__all__ = ["PredictionTracker", "exchange_span"]

PHASES = ("train", "eval")
#: Observations the fitted link rests on: the latest ones (a long run's link as it is now, and a
#: fit that costs the same in its ten-thousandth epoch as in its tenth).
FIT_WINDOW = 1024


#: Values per exchange point in :meth:`PredictionTracker.observation_vector`: calls, bytes,
#: negated seconds, negated marks, then (start, end, seconds, negated seconds) per mark.
_POINT = 4 + 4 * MARKS


def exchange_span(last_arrival: float, last_departure: float, longest: float,
                  shortest: float) -> float:
    r"""Seconds of one synchronous exchange as the group meets it: from the last rank's
    arrival to the last rank's departure (wall clock, maxed over ranks), within what the ranks
    measured themselves: no less than the last arrival spent in it (:obj:`shortest`, the
    least over ranks), no more than the longest any rank spent (clocks of hosts that disagree
    move it no further).

    Args:
        last_arrival (float): The latest start over ranks (seconds on the wall clock).
        last_departure (float): The latest end over ranks.
        longest (float): The most seconds a rank spent in the exchange.
        shortest (float): The fewest.

    Returns:
        float: Seconds.
    """
    return min(max(last_departure - last_arrival, shortest), max(longest, shortest))


def _order(call: ExchangeCall) -> tuple:
    return (call.key, call.direction, call.mode, call.channel, call.reverse, call.row_bytes,
            call.width, call.value_bytes, call.layer)


class PredictionTracker:
    r"""Per-epoch predictions for one rank of a running engine.

    Args:
        engine (FullGraphEngine): The engine (its plans give the rows).
        profile (ExchangeProfile, optional): The model's exchange calls; without it they are
            recorded from the run's first steps.
        link (LinkModel, optional): Latency and bandwidth (no seconds without it).
    """

    def __init__(self, engine: Any, profile: Optional[ExchangeProfile] = None,
                 link: Optional[LinkModel] = None) -> None:
        aggregation = getattr(engine, "aggregation", "post")
        if profile is not None and profile.aggregation != aggregation:
            raise ValueError(f"the profile was recorded with aggregation="
                             f"'{profile.aggregation}' but the engine runs '{aggregation}'")
        self.engine = engine
        self.aggregation = aggregation
        self.counts = RankCounts.from_engine(engine)
        self.given = profile
        self.link = link
        self.recorder: Optional[ExchangeRecorder] = None
        self.learned: Dict[str, List[Tuple[ExchangeCall, ...]]] = {p: [] for p in PHASES}
        self.steady = {p: False for p in PHASES}
        self.index = {p: 0 for p in PHASES}      # steps of the run so far
        self.offset = {p: 0 for p in PHASES}     # index at the epoch's start
        self.in_epoch = {p: 0 for p in PHASES}   # steps in the current epoch
        self._active: Optional[str] = None
        # (calls, busiest bytes, seconds) per exchange point of the latest steady epochs
        self.observed: deque = deque(maxlen=FIT_WINDOW)
        self.fitted: Optional[LinkModel] = None  # the link fitted to this run's exchanges
        self._epoch_points: List[Tuple[str, str]] = []  # exchange points of the last epoch
        # The overlap windows of the epoch's training steps alone, per exchange point:
        # evaluation overlaps exchanges that training may run synchronously (the halo cache,
        # boundary sampling), so the engine's counters, evaluation's included, would credit
        # training with windows it never had.
        self._train_windows: Dict[Tuple[str, str], List[float]] = {}
        self._mark: Optional[Dict[Tuple[str, str], Tuple[float, ...]]] = None
        # The engine's synchronous collectives outside the exchange in the epoch's training
        # steps (each one queues behind the pipeline's transfers in flight), and the count
        # at the running step's start.
        self._train_collectives = 0
        self._collectives_mark: Optional[int] = None
        # The engine's stage changes seen (step aside's arms and decision change the calls).
        self._stages_seen = getattr(engine, "stages_changed", 0)
        if profile is None:
            recorder = ExchangeRecorder(getattr(engine, "exchanges", None)
                                        or {"post": engine.exchange})
            if recorder.supported:
                self.recorder = recorder.install()

    @classmethod
    def start(cls, engine: Any, profile: Optional[ExchangeProfile] = None,
              link: Any = None) -> Optional["PredictionTracker"]:
        r"""A tracker for :obj:`engine`, or :obj:`None` (with a warning) when its exchanges
        cannot be followed.

        Args:
            engine (FullGraphEngine): The engine.
            profile (ExchangeProfile, optional): The model's exchange calls.
            link (LinkModel or str, optional): A link model, or ``"calibrate"`` to measure
                one on the engine's group now (every rank must get here).

        Returns:
            PredictionTracker or None
        """
        policy = getattr(engine, "policy", None)
        if policy is not None and any(getattr(c, "per_node", False) for c in policy.codecs()):
            # Same policy on every rank: all return here alike (no collective is skipped
            # on one rank only).
            warnings.warn("CommunicationMonitor: per-node bit widths (codec 'adaptive') are not "
                          "modelled by the planner yet; no predicted figures")
            return None
        if link == "calibrate":
            from .calibrate import calibrate
            # The codec whose cost the step pays (the first lossy one; the identity's is none).
            codec = next((c for c in policy.codecs() if not c.lossless), None) \
                if policy is not None else None
            # A block of 4M values: long enough that a CPU quota's or a scheduler's slices
            # average out (a small block is timed within one slice, or across a throttled one).
            group = getattr(engine, "group", None)
            rank, world = (dist.get_rank(group), dist.get_world_size(group)) \
                if dist.is_available() and dist.is_initialized() else (0, 1)
            # Collectives on the engine's group (its timeout), described as the engine's are.
            with guarded("link calibration (CommunicationMonitor(link='calibrate'))", rank,
                         [r for r in range(world) if r != rank],
                         getattr(engine, "timeout", None)):
                link = calibrate(group, codec=codec, codec_rows=16384, codec_width=256,
                                 contention=True, duplex=_duplex_group(engine),
                                 timeout=getattr(engine, "timeout", None))
            router = getattr(engine, "router", None)
            if router is not None and not isinstance(router.link, LinkModel):
                router.link = link  # aggregation="auto" decides on it: no second calibration
            if codec is None:  # exact rows are sent as they are: no codec time
                link = replace(link, codec_throughput=math.inf)
        elif isinstance(link, LinkModel) and policy is not None:
            # A link from a file (e.g. fitted to an exact run's exchanges) knows the codec it
            # was measured with; the run's lossy codec's throughput is measured here, on this
            # rank alone (the predicted seconds are maxed over ranks when logged).
            codec = next((c for c in policy.codecs() if not c.lossless), None)
            if codec is not None and type(codec).__name__ != link.codec:
                from .calibrate import _default_device, calibrate_codec_costs
                group = getattr(engine, "group", None)
                device = _default_device(dist.get_backend(group)) \
                    if dist.is_available() and dist.is_initialized() else None
                throughput, row_s = calibrate_codec_costs(codec, rows=16384, width=256,
                                                          device=device)
                link = replace(link, codec_throughput=throughput, codec_row_seconds=row_s,
                               codec=type(codec).__name__)
        if isinstance(link, LinkModel) and link.duplex_gain == 1.0 and _duplex_group(engine):
            # A link from a file measured without the engine's duplex transport: what both
            # directions at once gain is measured here, on the engine's group (a config the
            # same on every rank: all get here alike).
            from .calibrate import calibrate_duplex
            group = getattr(engine, "group", None)
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            with guarded("duplex calibration (CommunicationMonitor)", rank,
                         [r for r in range(world) if r != rank],
                         getattr(engine, "timeout", None)):
                link = replace(link, duplex_gain=calibrate_duplex(
                    group, timeout=getattr(engine, "timeout", None)))
        tracker = cls(engine, profile, link)
        if profile is None and tracker.recorder is None:
            warnings.warn("CommunicationMonitor: this engine's exchanges cannot be recorded; "
                          "no predicted figures (pass profile=profile_model(...))")
            return None
        return tracker

    @property
    def profile(self) -> ExchangeProfile:
        r"""The profile in use: the given one, or what was recorded so far."""
        if self.given is not None:
            return self.given
        return ExchangeProfile(self.aggregation, train=tuple(self.learned["train"]) or ((), ),
                               eval=tuple(self.learned["eval"]) or ((), ))

    # -- events ----------------------------------------------------------------------------
    def epoch_start(self) -> None:
        self.offset = dict(self.index)
        self.in_epoch = {p: 0 for p in PHASES}
        self._train_windows, self._mark = {}, None
        self._train_collectives, self._collectives_mark = 0, None

    def step_start(self, phase: str) -> None:
        self._active = phase
        changes = getattr(self.engine, "stages_changed", 0)
        if changes != self._stages_seen:
            # The exchanges run other stages (step aside tried an arm, or decided): a recorded
            # profile records the calls again from here until they repeat, appended, so the
            # steady state becomes the new stages' (a given profile cannot follow: it stays).
            self._stages_seen = changes
            if self.given is None:
                self.steady = {p: False for p in PHASES}
        if phase == "train":
            self._mark = self._windows_now()
            self._collectives_mark = self._collectives_now()
        if self.recorder is not None and not self.steady[phase]:
            self.recorder.begin()

    def step_end(self, phase: str) -> None:
        if self._active != phase:
            return
        self._active = None
        if phase == "train" and self._mark is not None:
            for point, now in self._windows_now().items():
                before = self._mark.get(point, (0.0, ) * len(now))
                total = self._train_windows.setdefault(point, [0.0] * len(now))
                for i, (a, b) in enumerate(zip(now, before)):
                    total[i] += max(0.0, a - b)  # a reset within the step counts from zero
            self._mark = None
        if phase == "train" and self._collectives_mark is not None:
            # A reset within the step (the epoch's counters) counts from zero.
            now = self._collectives_now()
            self._train_collectives += now - self._collectives_mark \
                if now >= self._collectives_mark else now
            self._collectives_mark = None
        if self.recorder is not None and self.recorder.recording:
            steps = self.learned[phase]
            steps.append(self.recorder.end())
            if len(steps) >= 2 and steps[-1] == steps[-2]:
                steps.pop()
                self.steady[phase] = True
        self.index[phase] += 1
        self.in_epoch[phase] += 1

    def epoch_end(self) -> Tuple[Dict[str, float], Optional[Tensor]]:
        r"""This rank's predicted figures of the epoch that ends.

        Returns:
            Tuple[Dict[str, float], Optional[torch.Tensor]]: ``{"comm/predicted_sent_MB",
            "comm/predicted_received_MB"}``, and with a link model this rank's seconds of
            every exchange call of the epoch (float64, a fixed order), to be reduced with
            ``MAX`` over ranks and summed.
        """
        calls = self.profile.calls(self.in_epoch["train"], self.in_epoch["eval"],
                                   self.offset["train"], self.offset["eval"])
        self._epoch_points = sorted({(call.key, call.direction) for call in calls})
        model = CommunicationModel(self.profile, self.link_now())
        totals = model.rank_bytes(self.counts, calls)
        out = {"comm/predicted_sent_MB": totals.get("bytes_sent", 0) / 1e6,
               "comm/predicted_received_MB": totals.get("bytes_received", 0) / 1e6}
        if self.link is None:
            return out, None
        seconds = [times * model.call_seconds(call, self.counts)[0]
                   for call, times in sorted(calls.items(), key=lambda kv: _order(kv[0]))]
        return out, torch.tensor(seconds, dtype=torch.float64)

    def step_seconds(self, stats: Any = None, collectives: Optional[float] = None,
                     step: Optional[float] = None) -> Optional[Tensor]:
        r"""This rank's predicted seconds of one steady training step (with a link model).

        Per exchange call :math:`c` of the step: its exchange seconds :math:`t_x(c)` (latency
        per peer plus the busiest rank's bytes over the bandwidth; SuperGCN Eqs. 2-3), its
        codec seconds :math:`t_q(c)` (encoding and decoding; Eqs. 4, 6), and its exposed
        seconds :math:`\max(0, t_x(c) - w(c))`: the part of the transfer that the work
        :math:`w(c)` the rank runs while it is in flight does not hide (overlap).
        :math:`w(c)` is measured, not predicted: the mean seconds between an asynchronous
        exchange's start and the wait for it at the call's exchange point and direction
        (``in_flight_seconds`` of :obj:`stats`, e.g. :meth:`training_windows`: the training
        steps' alone; 0 for a synchronous one).  Reduced with ``MAX`` over ranks and summed
        over calls, the planner's step is

        .. math::
            \max\Big(t_{compute} + \sum_c t_{exposed}(c),\ \sum_{c\ in\ step} t_x(c)\Big)
            + \sum_c t_q(c)

        with :math:`t_{compute}` measured (``comm/step_compute_s_min`` of a run without the
        reduction: the step without its blocked exchanges, least over ranks) and slowed by the
        transfers in flight beside it (the link's contention;
        :func:`~lightning_fullgraph.planner.predicted_step_seconds`): a step cannot
        take less than the link is busy with the transfers it waits for, however much of them
        overlaps.

        Background transfers (the asynchronous pipeline's, in flight from one step into the
        next on a process group of their own) need not end within the step: they are left
        out of the link term, and share one window, the mean seconds :math:`\bar w` from
        their start to the wait for them a step later: the step is exposed only to the
        backlog :math:`\max(0, \sum_{c\ bg} t_x(c) - \bar w)` a link too slow for them
        builds up, split over those calls in proportion to :math:`t_x(c)`.  While they are in
        flight, the step's own synchronous collectives outside the exchange (:math:`n` of them:
        the gradient reduction's, the signal agreement) queue behind their bytes on the link,
        each for the link's :attr:`~.link.LinkModel.queue_wait` :math:`q` when the link is
        busy with them: the step is exposed to
        :math:`n\, q \min(1, \sum_{c\ bg} t_x(c) / s)` more, split over the background calls
        the same way, with :math:`s` the measured training step (the transfers a step starts
        keep the link busy through its end if they outlast it; without it, :math:`\bar w`).

        Args:
            stats (CommStats, optional): The engine's counters so far (the windows); without
                them nothing counts as hidden.
            collectives (float, optional): :math:`n`, per training step (default:
                :meth:`step_collectives`).
            step (float, optional): :math:`s`, seconds of one training step as measured.

        Returns:
            torch.Tensor or None: float64 ``[4 * calls]``, ``(exchange, codec, exposed,
            in step)`` per call of :attr:`~.profile.ExchangeProfile.train_steady` in its order
            (the same on every rank; ``in step``: the exchange seconds the step must wait
            for, 0 for a background transfer), or ``None`` without a link model.
        """
        if self.link is None:
            return None
        model = CommunicationModel(self.profile, self.link_now())
        plain = CommunicationModel(self.profile, self.link)  # background: one collective
        counters = getattr(stats, "counters", {}) if stats is not None else {}
        rows: List[List[float]] = []
        background: List[int] = []
        windows: List[float] = []
        for call in self.profile.train_steady:
            exchange, codec = model.call_seconds(call, self.counts)
            c = counters.get((call.key, call.direction))
            if c is not None and c.background_waits:
                exchange, codec = plain.call_seconds(call, self.counts)
                background.append(len(rows))
                windows.append(c.background_in_flight_seconds / c.background_waits)
                rows.append([exchange, codec, 0.0, 0.0])
                continue
            waits = c.waits - c.background_waits if c is not None else 0
            window = (c.in_flight_seconds - c.background_in_flight_seconds) / waits \
                if waits else 0.0
            rows.append([exchange, codec, max(0.0, exchange - window), exchange])
        if background:
            total = sum(rows[i][0] for i in background)
            window = sum(windows) / len(windows)
            backlog = max(0.0, total - window)
            n = self.step_collectives() if collectives is None else float(collectives)
            scale = window if step is None else float(step)
            busy = min(1.0, total / scale) if scale > 0 else 1.0
            exposed = backlog + n * self.link.queue_wait * busy
            for i in background:
                rows[i][2] = rows[i][0] * exposed / total if total else 0.0
        return torch.tensor([v for row in rows for v in row], dtype=torch.float64)

    def link_now(self) -> Optional[LinkModel]:
        r"""The link the engine's exchanges meet now: :attr:`link`, at its
        :attr:`~.link.LinkModel.duplex_gain` while the transport sends both directions at
        once (:attr:`~lightning_fullgraph.engine.Transport.duplex`)."""
        if self.link is not None and _duplex_now(self.engine):
            return self.link.duplexed()
        return self.link

    def _collectives_now(self) -> int:
        return int(getattr(getattr(self.engine, "stats", None), "collectives", 0))

    def step_collectives(self) -> float:
        r"""The engine's synchronous collectives outside the halo exchange per training step
        of this epoch so far (the gradient reduction's, the signal agreement), mean over
        steps; ``0.0`` before the first."""
        steps = self.in_epoch["train"]
        return self._train_collectives / steps if steps else 0.0

    def _windows_now(self) -> Dict[Tuple[str, str], Tuple[float, ...]]:
        stats = getattr(self.engine, "stats", None)
        return {point: (c.in_flight_seconds, float(c.waits), c.background_in_flight_seconds,
                        float(c.background_waits))
                for point, c in getattr(stats, "counters", {}).items()}

    def training_windows(self) -> CommStats:
        r"""The overlap windows of this epoch's training steps alone (between
        :meth:`step_start` and :meth:`step_end` of ``"train"``), as counters for
        :meth:`step_seconds`: an exchange that training runs synchronously (boundary
        sampling, the halo cache) gets no window from evaluation's overlapped forwards."""
        stats = CommStats()
        for point, (in_flight, waits, bg_in_flight, bg_waits) in self._train_windows.items():
            c = stats.counters[point]
            c.in_flight_seconds, c.waits = in_flight, int(round(waits))
            c.background_in_flight_seconds = bg_in_flight
            c.background_waits = int(round(bg_waits))
        return stats

    # -- the link as training meets it ------------------------------------------------------
    def observation_vector(self, stats: Any) -> Tensor:
        r"""This rank's share of the epoch's observations (after :meth:`epoch_end`), to be
        reduced with ``MAX``: per exchange point of the epoch, the exchanges it made, the bytes
        this rank moved through it (the larger of sent and received: the busiest rank's after
        the reduction) and its negated seconds (the maximum of the negated is the smallest
        time: the rank that arrived last, which waited for no one's compute).  Measured, not
        predicted: what a cache skipped or a codec compressed counts as it went.

        Where every exchange of the point was synchronous, also the wall-clock start and end
        of the first :data:`~lightning_fullgraph.engine.stats.MARKS` of them, with their
        seconds and negated seconds: reduced, when the last rank arrived, when the last one
        left, and the longest and shortest time a rank was in the exchange
        (:func:`exchange_span`).

        Args:
            stats (CommStats): The engine's counters of the epoch.

        Returns:
            torch.Tensor: float64 ``[(4 + 4 * MARKS) * points]``, the same length and order on
            every rank.
        """
        counters, out = stats.counters, []
        for k in self._epoch_points:
            c = counters.get(k)
            row = [0.0] * _POINT
            if c is not None:
                marks = c.marks if not c.waits else []  # spans of synchronous exchanges only
                row[:4] = [float(c.calls), float(max(c.bytes_sent, c.bytes_received)),
                           -c.seconds, -float(len(marks))]
                for i, (start, end) in enumerate(marks[:MARKS]):
                    row[4 + 4 * i:8 + 4 * i] = [start, end, end - start, start - end]
            out += row
        return torch.tensor(out, dtype=torch.float64)

    def observe(self, reduced: Tensor) -> Optional[LinkModel]:
        r"""Adds the epoch's reduced :meth:`observation_vector` and refits :attr:`fitted`.

        The seconds of an exchange point are the time from the last rank's arrival to the last
        rank's departure, summed over its exchanges (:func:`exchange_span`; with more than
        :data:`~lightning_fullgraph.engine.stats.MARKS` exchanges, the last arrival's time
        scaled by the marked ones' ratio), where every exchange was synchronous; else the last
        arrival's time.  An all-to-all is not over when the rank that arrived last leaves it:
        its peers with more to move leave later, and the step waits for them (at 1 Gbit/s, 4
        ranks, up to a fifth longer).

        Only steady-state epochs count: not the run's first training epoch (one-time
        exchanges, first-touch allocations), nor one whose exchange calls are still being
        recorded.  The same on every rank (it reads only reduced values).

        Args:
            reduced (torch.Tensor): The vector reduced with ``MAX`` over ranks.

        Returns:
            LinkModel or None: :attr:`fitted`.
        """
        if len(reduced) != _POINT * len(self._epoch_points):
            raise ValueError("the reduced observations do not match this epoch's points")
        recorded = self.given is not None or all(
            self.steady[p] or not self.in_epoch[p] for p in PHASES)
        if self.counts.world_size < 2 or self.offset["train"] == 0 or not recorded:
            return self.fitted
        for row in reduced.view(-1, _POINT).tolist():
            calls, nbytes, seconds, marked = row[0], row[1], -row[2], int(-row[3])
            if calls <= 0:
                continue
            if marked > 0:
                slots = [row[4 + 4 * i:8 + 4 * i] for i in range(min(marked, MARKS))]
                spans = [exchange_span(a, b, longest, -negated)
                         for a, b, longest, negated in slots]
                if marked >= calls:
                    seconds = sum(spans)
                else:
                    shortest = sum(-negated for *_, negated in slots)
                    seconds *= sum(spans) / shortest if shortest > 0 else 1.0
            # Kept in one collective's time (what a duplex transport gained taken back out
            # of the bytes' share; the latency it did not shorten): the fitted link is the
            # group's, and :meth:`link_now` applies the gain where the exchanges split.
            if _duplex_now(self.engine) and self.link is not None:
                seconds = self.link.one_collective_seconds(seconds, int(calls),
                                                           self.counts.world_size)
            self.observed.append((int(calls), int(nbytes), seconds))
        try:
            transport = getattr(self.engine, "transport", None)
            self.fitted = fit_link(self.observed, self.counts.world_size, prior=self.link,
                                   backend=getattr(transport, "backend", None))
        except ValueError:  # nothing timed yet (e.g. every exchange of zero seconds)
            pass
        return self.fitted

    def close(self) -> None:
        r"""Stops recording (restores the exchanges' own methods)."""
        if self.recorder is not None:
            self.recorder.remove()
            self.recorder = None


def _duplex_group(engine: Any) -> bool:
    r"""Whether :obj:`engine`'s transport has a duplex group (it may be set aside now)."""
    return getattr(getattr(engine, "transport", None), "duplex_group", None) is not None


def _duplex_now(engine: Any) -> bool:
    r"""Whether :obj:`engine`'s exchanges now send both directions at once."""
    return bool(getattr(getattr(engine, "transport", None), "duplex", False))
