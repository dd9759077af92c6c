r"""SuperGCN's communication model (ICS'25, Eqs. 2-4) applied to the engine's plans.

Given what crosses the wire per exchange (:class:`~.counts.RankCounts`, from the aggregation
plans), what a model exchanges (:class:`~.profile.ExchangeProfile`) and, optionally, the
measured link (:class:`~.link.LinkModel`), :class:`CommunicationModel` predicts per exchange
point, per layer and per epoch:

* **rows and bytes** of every rank, sent and received, per direction: for each exchange call,
  the rows of its plan's channel (reversed for gradients and slot degrees) times the bytes of
  its wire rows -- exactly what :class:`~lightning_fullgraph.engine.Transport` counts;
* **seconds** of each exchange: ``all_to_all`` is bulk-synchronous, so one exchange takes as
  long as its busiest rank, :math:`\max_r \bigl(\alpha (P-1) + \max(S_r, R_r) / \beta\bigr)`
  with :math:`S_r, R_r` the bytes rank :math:`r` sends and receives (Eq. 2: latency per peer
  plus volume over bandwidth, maximum over ranks); the epoch is the sum over its exchanges;
* **codec seconds** (Eq. 4): encoding what a rank sends and decoding what it receives at the
  measured codec throughput, again the busiest rank per exchange (not part of the exchange
  seconds the transport measures);
* **memory per rank** (:func:`~.memory.memory_estimate`).

An *epoch* is ``train_steps`` training steps (forward + backward; one in full-graph training)
plus ``eval_forwards`` forwards without gradients, in the steady state by default;
``train_offset``/``eval_offset`` place the epoch in the run instead (``0``: it starts with the
run's first step, whose one-time exchanges -- normalization degrees, unchanged inputs that
the engine caches afterwards -- are then included).
"""
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .counts import RankCounts
from .link import LinkModel
from .memory import memory_estimate
from .profile import ExchangeCall, ExchangeProfile

__all__ = ["CommunicationModel", "Prediction", "PointPrediction", "predict"]


@dataclass
class PointPrediction:
    r"""Prediction for one exchange point and direction (the keys of
    :class:`~lightning_fullgraph.engine.CommStats`), summed over its calls in the epoch.

    Args:
        key (str): Exchange point.
        direction (str): ``"forward"`` or ``"backward"``.
        layer (str): Its message-passing layer.
        calls (int): Exchanges in the epoch.
        rows_sent, rows_received, bytes_sent, bytes_received (List[int]): Per rank.
        seconds (float, optional): Exchange seconds (busiest rank per call), with a link.
        codec_seconds (float, optional): Encode + decode seconds (busiest rank per call).
        busiest_bytes (int): Summed over the calls, the bytes the busiest rank sends or
            receives (the larger): what the bandwidth term of :attr:`seconds` divides.
    """
    key: str
    direction: str
    layer: str
    calls: int = 0
    rows_sent: List[int] = field(default_factory=list)
    rows_received: List[int] = field(default_factory=list)
    bytes_sent: List[int] = field(default_factory=list)
    bytes_received: List[int] = field(default_factory=list)
    seconds: Optional[float] = None
    codec_seconds: Optional[float] = None
    busiest_bytes: int = 0


@dataclass
class Prediction:
    r"""What an epoch moves, how long it takes and what each rank holds.

    Args:
        aggregation (str): The engine's aggregation.
        world_size (int): Ranks.
        train_steps (int): Training steps per epoch.
        eval_forwards (int): Forwards without gradients per epoch.
        points (List[PointPrediction]): Per exchange point and direction.
        memory (List[Dict[str, int]]): Per rank, :func:`~.memory.memory_estimate`.
        rows_per_exchange (int): Rows one feature exchange moves, all ranks (both channels), in
            the plan the model's exchanges use (post for layers that are never
            pre-aggregated, e.g. attention).
        hosts (int): Hosts the ranks are spread over (host-major numbering).
        inter_host_bytes (int): Bytes per epoch between ranks of different hosts.
        link (Dict[str, Any], optional): The :class:`LinkModel` used.
    """
    aggregation: str
    world_size: int
    train_steps: int
    eval_forwards: int
    points: List[PointPrediction]
    memory: List[Dict[str, int]]
    rows_per_exchange: int
    hosts: int = 1
    inter_host_bytes: int = 0
    link: Optional[Dict[str, Any]] = None

    # -- totals ---------------------------------------------------------------------------
    def _per_rank(self, attr: str, direction: Optional[str] = None) -> List[int]:
        out = [0] * self.world_size
        for p in self.points:
            if direction is None or p.direction == direction:
                for r, v in enumerate(getattr(p, attr)):
                    out[r] += v
        return out

    def bytes_sent(self, direction: Optional[str] = None) -> List[int]:
        r"""Bytes each rank sends per epoch (one direction or both)."""
        return self._per_rank("bytes_sent", direction)

    def bytes_received(self, direction: Optional[str] = None) -> List[int]:
        r"""Bytes each rank receives per epoch (one direction or both)."""
        return self._per_rank("bytes_received", direction)

    def rows_sent(self, direction: Optional[str] = None) -> List[int]:
        r"""Rows each rank sends per epoch."""
        return self._per_rank("rows_sent", direction)

    @property
    def seconds(self) -> Optional[float]:
        r"""Predicted exchange seconds per epoch (:obj:`None` without a link model)."""
        if any(p.seconds is None for p in self.points):
            return None
        return sum(p.seconds for p in self.points)

    @property
    def codec_seconds(self) -> Optional[float]:
        r"""Predicted encode + decode seconds per epoch (:obj:`None` without a link model)."""
        if any(p.codec_seconds is None for p in self.points):
            return None
        return sum(p.codec_seconds for p in self.points)

    def per_key(self, rank: int) -> Dict[Tuple[str, str], Dict[str, int]]:
        r"""One rank's figures per ``(key, direction)``, comparable with
        ``engine.stats.counters``.

        Returns:
            Dict[Tuple[str, str], Dict[str, int]]: ``calls``, ``rows_sent``,
            ``rows_received``, ``bytes_sent``, ``bytes_received``.
        """
        return {(p.key, p.direction): dict(calls=p.calls, rows_sent=p.rows_sent[rank],
                                           rows_received=p.rows_received[rank],
                                           bytes_sent=p.bytes_sent[rank],
                                           bytes_received=p.bytes_received[rank])
                for p in self.points}

    def layers(self) -> Dict[str, Dict[str, Any]]:
        r"""Per layer and direction: bytes sent (busiest rank, all ranks) and seconds.

        Returns:
            Dict[str, Dict[str, Any]]
        """
        out: Dict[str, Dict[str, Any]] = {}
        for p in self.points:
            entry = out.setdefault(p.layer, {})
            d = entry.setdefault(p.direction, {"bytes_sent_total": 0, "bytes_sent": [0] * len(
                p.bytes_sent), "seconds": 0.0 if p.seconds is not None else None})
            d["bytes_sent_total"] += sum(p.bytes_sent)
            d["bytes_sent"] = [a + b for a, b in zip(d["bytes_sent"], p.bytes_sent)]
            if p.seconds is not None and d["seconds"] is not None:
                d["seconds"] += p.seconds
        for entry in out.values():
            for d in entry.values():
                d["bytes_sent_max"] = max(d.pop("bytes_sent"), default=0)
        return out

    def summary(self) -> Dict[str, Any]:
        r"""The headline figures (JSON-able): bytes per epoch per rank (mean and max, sent),
        per direction, exchange and codec seconds, memory per rank, rows per exchange."""
        sent = self.bytes_sent()
        P = max(self.world_size, 1)
        mem = [m["total"] for m in self.memory]
        return {
            "aggregation": self.aggregation,
            "world_size": self.world_size,
            "rows_per_exchange": self.rows_per_exchange,
            "bytes_per_epoch_mean": sum(sent) / P,
            "bytes_per_epoch_max": max(sent, default=0),
            "bytes_per_epoch_total": sum(sent),
            "forward_bytes_max": max(self.bytes_sent("forward"), default=0),
            "backward_bytes_max": max(self.bytes_sent("backward"), default=0),
            "exchange_seconds": self.seconds,
            "codec_seconds": self.codec_seconds,
            "exchanges": sum(p.calls for p in self.points),
            "memory_bytes_max": max(mem, default=0),
            "memory_bytes_mean": sum(mem) / P,
            "inter_host_bytes": self.inter_host_bytes if self.hosts > 1 else None,
        }

    def to_dict(self) -> Dict[str, Any]:
        r"""Everything, JSON-able."""
        out = asdict(self)
        out["summary"] = self.summary()
        out["layers"] = self.layers()
        return out


class CommunicationModel:
    r"""Predicts rows, bytes, seconds and memory of a model's exchanges on a partition.

    Args:
        profile (ExchangeProfile): What the model exchanges (:func:`~.profile.profile_model`).
        link (LinkModel, optional): Measured latency and bandwidth (:func:`~.calibrate.calibrate`);
            without it no seconds are predicted.
    """

    def __init__(self, profile: ExchangeProfile, link: Optional[LinkModel] = None) -> None:
        self.profile = profile
        self.link = link

    # -- one rank ------------------------------------------------------------------------------
    @staticmethod
    def call_rows(call: ExchangeCall, counts: RankCounts) -> Tuple[List[int], List[int]]:
        r"""Rows :obj:`counts`' rank sends to / receives from each peer in :obj:`call` (the
        expected rows of a sampled call: the plan's times its :attr:`~.ExchangeCall.fraction`,
        rounded)."""
        sent, received = counts.rows(call.mode, call.channel, call.reverse)
        fraction = getattr(call, "fraction", 1.0)
        if fraction == 1.0:
            return sent, received
        return ([int(round(n * fraction)) for n in sent],
                [int(round(n * fraction)) for n in received])

    def call_seconds(self, call: ExchangeCall, counts: RankCounts) -> Tuple[float, float]:
        r"""This rank's view of one call: ``(exchange seconds, codec seconds)`` if it were the
        busiest rank (needs a link model). The exchange takes the maximum over ranks."""
        if self.link is None:
            raise ValueError("predicting seconds needs a LinkModel")
        sent, received = self.call_rows(call, counts)
        s, r = sum(sent), sum(received)
        seconds = self.link.exchange_seconds(max(s, r) * call.row_bytes, counts.world_size)
        codec = self.link.codec_seconds(s * call.decoded_row_bytes, r * call.decoded_row_bytes,
                                        s, r) if counts.world_size > 1 else 0.0
        return seconds, codec

    def rank_bytes(self, counts: RankCounts, calls: Counter) -> Dict[str, int]:
        r"""Bytes and rows one rank sends and receives for :obj:`calls` (no other rank needed).

        Args:
            counts (RankCounts): The rank's counts.
            calls (collections.Counter): ``{ExchangeCall: times}``
                (:meth:`ExchangeProfile.calls`).

        Returns:
            Dict[str, int]: ``bytes_sent``, ``bytes_received``, ``rows_sent``,
            ``rows_received``, and the same per direction (``forward_bytes_sent``, ...).
        """
        out: Dict[str, int] = Counter()
        for call, times in calls.items():
            sent, received = self.call_rows(call, counts)
            s, r = sum(sent) * times, sum(received) * times
            for prefix in ("", f"{call.direction}_"):
                out[f"{prefix}rows_sent"] += s
                out[f"{prefix}rows_received"] += r
                out[f"{prefix}bytes_sent"] += s * call.row_bytes
                out[f"{prefix}bytes_received"] += r * call.row_bytes
        return dict(out)

    # -- all ranks -------------------------------------------------------------------------------
    def predict(self, counts: Sequence[RankCounts], *, train_steps: int = 1,
                eval_forwards: int = 0, train_offset: Optional[int] = None,
                eval_offset: Optional[int] = None, hosts: int = 1) -> Prediction:
        r"""Predicts one epoch on the partition whose ranks :obj:`counts` describes.

        Args:
            counts (Sequence[RankCounts]): Every rank's counts, index == rank.
            train_steps (int): Training steps per epoch.
            eval_forwards (int): Forwards without gradients per epoch.
            train_offset (int, optional): Index in the run of the epoch's first training step
                (:obj:`None`: steady state).
            eval_offset (int, optional): Index in the run of the epoch's first evaluation
                forward (:obj:`None`: steady state).
            hosts (int): Hosts (a divisor of :math:`P`) for the inter-host bytes.

        Returns:
            Prediction
        """
        counts = list(counts)
        P = len(counts)
        if P == 0 or [c.rank for c in counts] != list(range(P)) \
                or any(c.world_size != P for c in counts):
            raise ValueError("predict needs the counts of every rank, in rank order")
        if hosts < 1 or P % hosts:
            raise ValueError(f"hosts={hosts} must be a positive divisor of {P}")
        per_host = P // hosts
        calls = self.profile.calls(train_steps, eval_forwards, train_offset, eval_offset)
        points: Dict[Tuple[str, str], PointPrediction] = {}
        inter = 0
        for call, times in calls.items():
            point = points.get((call.key, call.direction))
            if point is None:
                point = points[(call.key, call.direction)] = PointPrediction(
                    call.key, call.direction, call.layer, 0, [0] * P, [0] * P, [0] * P, [0] * P,
                    0.0 if self.link is not None else None,
                    0.0 if self.link is not None else None)
            point.calls += times
            worst, worst_codec, busiest = 0.0, 0.0, 0
            for r, c in enumerate(counts):
                sent, received = self.call_rows(call, c)
                s, rec = sum(sent), sum(received)
                point.rows_sent[r] += s * times
                point.rows_received[r] += rec * times
                point.bytes_sent[r] += s * times * call.row_bytes
                point.bytes_received[r] += rec * times * call.row_bytes
                busiest = max(busiest, max(s, rec) * call.row_bytes)
                if hosts > 1:
                    inter += times * call.row_bytes * sum(
                        n for peer, n in enumerate(sent) if peer // per_host != r // per_host)
                if self.link is not None:
                    t, tc = self.call_seconds(call, c)
                    worst, worst_codec = max(worst, t), max(worst_codec, tc)
            point.busiest_bytes += times * busiest
            if self.link is not None:
                point.seconds += times * worst
                point.codec_seconds += times * worst_codec
        used = self.profile.effective_mode
        rows = sum(c.rows_per_exchange(used) for c in counts if used in c.num_halo)
        return Prediction(
            aggregation=self.profile.aggregation, world_size=P, train_steps=int(train_steps),
            eval_forwards=int(eval_forwards), points=list(points.values()),
            memory=[memory_estimate(self.profile, c) for c in counts],
            rows_per_exchange=rows, hosts=int(hosts), inter_host_bytes=inter,
            link=self.link.to_dict() if self.link is not None else None)


def predict(profile: ExchangeProfile, counts: Sequence[RankCounts],
            link: Optional[LinkModel] = None, **kwargs: Any) -> Prediction:
    r"""Shorthand for ``CommunicationModel(profile, link).predict(counts, **kwargs)``.

    Args:
        profile (ExchangeProfile): What the model exchanges.
        counts (Sequence[RankCounts]): Every rank's plan counts.
        link (LinkModel, optional): Measured link.
        **kwargs: :meth:`CommunicationModel.predict` options.

    Returns:
        Prediction
    """
    return CommunicationModel(profile, link).predict(counts, **kwargs)
