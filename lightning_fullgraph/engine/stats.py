"""Communication accounting: bytes and seconds per exchange point, per direction."""
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

__all__ = ["CommStats", "ExchangeCounter"]

#: Synchronous exchanges per counter whose start and end are kept (:attr:`ExchangeCounter.marks`).
MARKS = 32


@dataclass
class ExchangeCounter:
    r"""Totals for one exchange point (a layer argument) and one direction."""

    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    rows_sent: int = 0
    rows_received: int = 0
    seconds: float = 0.0
    # Of asynchronous exchanges: seconds between a transfer's start and the wait for it, the
    # work that ran while the rows were in flight (what overlap can hide the transfer behind).
    in_flight_seconds: float = 0.0
    waits: int = 0  # asynchronous exchanges waited for (those in_flight_seconds counts)
    # Of which background ones (the pipeline's: completed in a later step, their transfers
    # need not end within the step that started them), and their seconds in flight.
    background_waits: int = 0
    background_in_flight_seconds: float = 0.0
    inter_host_bytes_sent: int = 0  # the part of bytes_sent that went to other hosts
    inter_host_bytes_received: int = 0
    rows_eligible: int = 0  # rows a cached exchange could have sent
    rows_skipped: int = 0  # of which the receivers' cached copies served
    features_sent: int = 0  # feature values encoded for the wire
    feature_bits: int = 0  # their payload bits (row headers aside)
    pipelined: int = 0  # exchanges run by the asynchronous pipeline
    stale: int = 0  # of which handed the layer the previous step's rows
    # Wall-clock (start, end) of the first MARKS synchronous exchanges, in call order: with
    # every rank's, when the last rank arrived and when the last one left (the planner's
    # fitted link, :meth:`~lightning_fullgraph.planner.PredictionTracker.observation_vector`).
    # Not summed by add(): marks of different exchanges do not add.
    marks: List[Tuple[float, float]] = field(default_factory=list)

    def add(self, other: "ExchangeCounter") -> None:
        self.features_sent += other.features_sent
        self.feature_bits += other.feature_bits
        self.pipelined += other.pipelined
        self.stale += other.stale
        self.rows_eligible += other.rows_eligible
        self.rows_skipped += other.rows_skipped
        self.inter_host_bytes_sent += other.inter_host_bytes_sent
        self.inter_host_bytes_received += other.inter_host_bytes_received
        self.calls += other.calls
        self.bytes_sent += other.bytes_sent
        self.bytes_received += other.bytes_received
        self.rows_sent += other.rows_sent
        self.rows_received += other.rows_received
        self.seconds += other.seconds
        self.in_flight_seconds += other.in_flight_seconds
        self.waits += other.waits
        self.background_waits += other.background_waits
        self.background_in_flight_seconds += other.background_in_flight_seconds


@dataclass
class CommStats:
    r"""Per-rank communication statistics of a :class:`HaloExchange`.

    Counters are keyed by ``(key, direction)`` with ``direction`` in
    ``{"forward", "backward"}`` and accumulate until :meth:`reset`, so a caller
    takes an epoch's figures with :meth:`snapshot` then :meth:`reset`.
    """

    counters: Dict[tuple, ExchangeCounter] = field(
        default_factory=lambda: defaultdict(ExchangeCounter))
    #: Synchronous collectives of the engine's group outside the halo exchange (the
    #: gradient reduction's, the strategy's signal agreement): each one queues behind a
    #: transfer still in flight on the link (the planner's
    #: :attr:`~lightning_fullgraph.planner.LinkModel.queue_wait`).
    collectives: int = 0

    def record(self, key: str, direction: str, *, bytes_sent: int, bytes_received: int,
               rows_sent: int, rows_received: int, seconds: float,
               inter_host_bytes_sent: int = 0, inter_host_bytes_received: int = 0,
               started: Optional[float] = None) -> None:
        r"""One exchange; :obj:`started`: the wall-clock second a synchronous one began
        (kept with its end, ``started + seconds``, among the counter's :attr:`marks`)."""
        c = self.counters[(key, direction)]
        if started is not None and len(c.marks) < MARKS:
            c.marks.append((float(started), float(started) + float(seconds)))
        c.inter_host_bytes_sent += inter_host_bytes_sent
        c.inter_host_bytes_received += inter_host_bytes_received
        c.calls += 1
        c.bytes_sent += bytes_sent
        c.bytes_received += bytes_received
        c.rows_sent += rows_sent
        c.rows_received += rows_received
        c.seconds += seconds

    def add_seconds(self, key: str, direction: str, seconds: float,
                    in_flight: float = 0.0, background: bool = False) -> None:
        r"""Time spent waiting for an asynchronous exchange already recorded, and the time
        the caller worked between its start and that wait (:obj:`in_flight`);
        :obj:`background`: a transfer that was in flight into a later step (the pipeline's)."""
        c = self.counters[(key, direction)]
        c.seconds += seconds
        c.in_flight_seconds += in_flight
        c.waits += 1
        if background:
            c.background_waits += 1
            c.background_in_flight_seconds += in_flight

    def record_cache(self, key: str, direction: str, *, eligible: int, skipped: int) -> None:
        r"""Rows an adaptive-cache exchange could have sent, and how many it skipped."""
        c = self.counters[(key, direction)]
        c.rows_eligible += eligible
        c.rows_skipped += skipped

    def record_wire(self, key: str, direction: str, *, features: int, bits: int) -> None:
        r"""Feature values a codec encoded for the wire and their payload bits (the wire
        format actually used: per-node widths included)."""
        c = self.counters[(key, direction)]
        c.features_sent += features
        c.feature_bits += bits

    def record_pipeline(self, key: str, direction: str, *, stale: bool) -> None:
        r"""One exchange of the asynchronous pipeline, and whether it handed the layer the
        previous step's rows (asynchronous) or waited for this step's (synchronous)."""
        c = self.counters[(key, direction)]
        c.pipelined += 1
        c.stale += int(stale)

    def record_collectives(self, count: int) -> None:
        r"""Synchronous collectives run outside the halo exchange (:attr:`collectives`)."""
        self.collectives += int(count)

    def reset(self) -> None:
        self.counters.clear()
        self.collectives = 0

    def total(self, direction: str = None) -> ExchangeCounter:
        r"""Sums all counters, or those of one direction."""
        out = ExchangeCounter()
        for (_, d), c in self.counters.items():
            if direction is None or d == direction:
                out.add(c)
        return out

    def per_key(self) -> Dict[str, ExchangeCounter]:
        r"""Sums both directions per exchange point."""
        out: Dict[str, ExchangeCounter] = defaultdict(ExchangeCounter)
        for (key, _), c in self.counters.items():
            out[key].add(c)
        return dict(out)

    def snapshot(self) -> Dict[str, float]:
        r"""Flat dictionary for loggers: totals and per-direction figures."""
        out: Dict[str, float] = {}
        for direction in ("forward", "backward"):
            t = self.total(direction)
            out[f"comm/{direction}_bytes_sent"] = float(t.bytes_sent)
            out[f"comm/{direction}_bytes_received"] = float(t.bytes_received)
            out[f"comm/{direction}_seconds"] = t.seconds
        t = self.total()
        out["comm/bytes_sent"] = float(t.bytes_sent)
        out["comm/bytes_received"] = float(t.bytes_received)
        out["comm/inter_host_bytes_sent"] = float(t.inter_host_bytes_sent)
        out["comm/inter_host_bytes_received"] = float(t.inter_host_bytes_received)
        out["comm/seconds"] = t.seconds
        out["comm/exchanges"] = float(t.calls)
        out["comm/rows_eligible"] = float(t.rows_eligible)
        out["comm/rows_skipped"] = float(t.rows_skipped)
        return out
