r"""The measured cost of moving bytes: latency, bandwidth and codec throughput.

A :class:`LinkModel` holds the three numbers SuperGCN's communication model (ICS'25, Eqs. 2-4)
needs, measured by :mod:`.calibrate` on the process group that trains:

* :attr:`~LinkModel.alpha`, the latency of one ``all_to_all_single`` per peer (SuperGCN's
  :math:`L`);
* :attr:`~LinkModel.beta`, the bandwidth in bytes per second one rank moves through it
  (SuperGCN's :math:`BW`);
* :attr:`~LinkModel.codec_throughput`, the bytes per second a codec encodes and decodes
  (SuperGCN's :math:`TH_{cal}`), and :attr:`~LinkModel.codec_row_seconds`, what each row
  costs on top (a codec that writes a header per row pays it per row: a 5-class layer's
  rows cost it ten times more per byte than 256-wide ones);
* :attr:`~LinkModel.contention`, the fraction of its compute a rank loses while its own
  transfers are in flight (moving bytes takes the cores that compute too): what overlap costs;
* :attr:`~LinkModel.queue_wait`, the seconds a small synchronous collective waits longer
  while a transfer of the rank's own on another process group fills the link's queue (the
  asynchronous pipeline's, in flight into the next step, delays the step's gradient
  all-reduce): what a transfer left running past the step costs;
* :attr:`~LinkModel.duplex_gain`, how many times faster a bulk exchange runs with its two
  directions at once on two groups (``ExchangeConfig(duplex=True)``; gloo carries one
  direction of a pair's connection at a time): the bandwidth of a duplex exchange.

The time of one exchange in which the busiest rank sends or receives :math:`B` bytes over a
group of :math:`P` ranks is :math:`\alpha (P - 1) + B / \beta` (gloo's all-to-all talks to
every peer, even with nothing to send).
"""
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Tuple, Union

__all__ = ["LinkModel"]


@dataclass
class LinkModel:
    r"""Latency, bandwidth and codec throughput of one process group (JSON-able).

    Args:
        alpha (float): Seconds of latency per peer and exchange.
        beta (float): Bytes per second one rank sends (and receives) in an exchange.
        codec_throughput (float): Bytes per second of ``encode`` + ``decode`` of the codec
            that was measured (the identity codec unless stated otherwise), each row's own
            cost aside.
        world_size (int): Ranks of the group it was measured on.
        backend (str): ``"gloo"``, ``"nccl"`` or ``"none"`` (one process: a memory copy).
        device (str): Device of the measured tensors.
        samples (List[Tuple[int, float]]): The measurements: bytes one rank sent per exchange,
            mean over repetitions of the fastest rank's seconds.
        codec (str): Class name of the measured codec.
        contention (float): Compute seconds a rank loses per second that a transfer of its own
            is in flight beside it, in ``[0, 1)`` (:func:`~.calibrate.calibrate_contention`;
            ``0.0``: not measured, overlap taken as free).
        queue_wait (float): Seconds one small synchronous collective on the group takes longer
            while a transfer of the rank's own on another group keeps the link busy: its
            messages queue behind the transfer's bytes (:func:`~.calibrate.calibrate_queue_wait`;
            ``0.0``: not measured).
        codec_row_seconds (float): Seconds of ``encode`` + ``decode`` per row on top of its
            bytes (:func:`~.calibrate.calibrate_codec_costs`; ``0.0``: not measured, the
            throughput alone).
        source (str): How it was measured: ``"ping-pong"`` (:func:`~.calibrate.calibrate`) or
            ``"training"`` (:func:`~.fit.fit_link`, from the exchanges of a run).
        duplex_gain (float): A bulk exchange's time as one collective over its time with
            its two directions on two groups (:func:`~.calibrate.calibrate_duplex`; ``1.0``:
            not measured, or nothing gained).  :meth:`duplexed` is the link a duplex
            transport meets.
    """
    alpha: float
    beta: float
    codec_throughput: float = math.inf
    world_size: int = 1
    backend: str = "none"
    device: str = "cpu"
    samples: List[Tuple[int, float]] = field(default_factory=list)
    codec: str = "IdentityCodec"
    source: str = "ping-pong"
    contention: float = 0.0
    codec_row_seconds: float = 0.0
    queue_wait: float = 0.0
    duplex_gain: float = 1.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "codec_throughput"):
            value = float(getattr(self, name))
            if not value > 0 or math.isnan(value):
                raise ValueError(f"LinkModel.{name} must be positive, got {value}")
            setattr(self, name, value)
        self.samples = [(int(b), float(s)) for b, s in self.samples]
        self.contention = float(self.contention)
        self.codec_row_seconds = float(self.codec_row_seconds)
        if not self.codec_row_seconds >= 0 or math.isinf(self.codec_row_seconds):
            raise ValueError(f"LinkModel.codec_row_seconds must be finite and >= 0, got "
                             f"{self.codec_row_seconds}")
        self.queue_wait = float(self.queue_wait)
        if not self.queue_wait >= 0 or math.isinf(self.queue_wait):
            raise ValueError(f"LinkModel.queue_wait must be finite and >= 0, got "
                             f"{self.queue_wait}")
        self.duplex_gain = float(self.duplex_gain)
        if not self.duplex_gain > 0 or math.isinf(self.duplex_gain):
            raise ValueError(f"LinkModel.duplex_gain must be positive and finite, got "
                             f"{self.duplex_gain}")
        if not 0.0 <= self.contention < 1.0:
            raise ValueError(f"LinkModel.contention must be in [0, 1), got {self.contention}")
        if self.source not in ("ping-pong", "training"):
            raise ValueError(f"LinkModel.source must be 'ping-pong' or 'training', "
                             f"got {self.source!r}")

    def exchange_seconds(self, bytes_per_rank: float, world_size: int) -> float:
        r"""Predicted seconds of one exchange.

        Args:
            bytes_per_rank (float): Bytes the busiest rank sends or receives (the larger).
            world_size (int): Ranks taking part.

        Returns:
            float: :math:`\alpha (P - 1) + B / \beta`, ``0.0`` for one rank (no exchange).
        """
        if world_size <= 1:
            return 0.0
        return self.alpha * (world_size - 1) + float(bytes_per_rank) / self.beta

    def duplexed(self) -> "LinkModel":
        r"""The link as a duplex transport meets it: :attr:`beta` times
        :attr:`duplex_gain` (the latency stays: the two collectives of an exchange start
        together).

        Returns:
            LinkModel: A copy, its :attr:`duplex_gain` ``1.0``.
        """
        return replace(self, beta=self.beta * self.duplex_gain, duplex_gain=1.0)

    def one_collective_seconds(self, seconds: float, exchanges: int, world_size: int) -> float:
        r"""What :obj:`exchanges` exchanges that took :obj:`seconds` with their two
        directions on two groups (:meth:`duplexed`) would take as one collective each: the
        inverse of :meth:`duplexed` for times observed (a link fitted to a duplex run is
        kept in one collective's time).  Their latency, :math:`\alpha (P - 1)` each, stays;
        the rest takes :attr:`duplex_gain` times longer.

        Args:
            seconds (float): Observed seconds, the exchanges together.
            exchanges (int): How many exchanges they are.
            world_size (int): Ranks taking part.

        Returns:
            float: At least :obj:`seconds` (:obj:`seconds` where the gain is ``1.0``).
        """
        seconds = float(seconds)
        latency = min(seconds, exchanges * self.alpha * max(int(world_size) - 1, 0))
        return latency + (seconds - latency) * self.duplex_gain

    def limited_to(self, bits_per_second: float) -> "LinkModel":
        r"""This link with each rank's bandwidth capped at :obj:`bits_per_second` (a
        machine's network link, e.g. ``1e9``; its latency stays the measured one).

        Args:
            bits_per_second (float): The link's rate.

        Returns:
            LinkModel: A copy whose :attr:`beta` is at most ``bits_per_second / 8``.
        """
        rate = float(bits_per_second)
        if not rate > 0 or math.isinf(rate):
            raise ValueError(f"link rate must be positive and finite, got {bits_per_second}")
        return replace(self, beta=min(self.beta, rate / 8.0))

    def codec_seconds(self, bytes_encoded: float, bytes_decoded: float,
                      rows_encoded: float = 0, rows_decoded: float = 0) -> float:
        r"""Predicted seconds a rank spends encoding and decoding.

        Args:
            bytes_encoded (float): Decoded-size bytes the rank encodes (sends).
            bytes_decoded (float): Decoded-size bytes the rank decodes (receives).
            rows_encoded (float): Rows they make up. (default: :obj:`0`: bytes alone)
            rows_decoded (float): Rows of the received bytes. (default: :obj:`0`)

        Returns:
            float: ``(bytes_encoded + bytes_decoded) / (2 * codec_throughput)`` plus
            ``(rows_encoded + rows_decoded) * codec_row_seconds / 2``: both count one
            encode and one decode of the same rows.
        """
        if math.isinf(self.codec_throughput):
            return 0.0
        return (float(bytes_encoded) + float(bytes_decoded)) / (2.0 * self.codec_throughput) \
            + (float(rows_encoded) + float(rows_decoded)) * self.codec_row_seconds / 2.0

    def to_dict(self) -> Dict[str, Any]:
        r"""JSON-able dictionary (infinite throughput as ``None``).

        Returns:
            Dict[str, Any]
        """
        out = asdict(self)
        out["samples"] = [list(s) for s in self.samples]
        if math.isinf(self.codec_throughput):
            out["codec_throughput"] = None
        return out

    @classmethod
    def from_dict(cls, state: Dict[str, Any]) -> "LinkModel":
        r"""Inverse of :meth:`to_dict`.

        Args:
            state (Dict[str, Any]): A dictionary from :meth:`to_dict`.

        Returns:
            LinkModel
        """
        state = dict(state)
        if state.get("codec_throughput") is None:
            state["codec_throughput"] = math.inf
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"unknown LinkModel fields {unknown}")
        return cls(**state)

    def save(self, path: Union[str, Path]) -> Path:
        r"""Writes :meth:`to_dict` as JSON.

        Args:
            path (str or Path): The file.

        Returns:
            Path: The file written.
        """
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: Union[str, Path]) -> "LinkModel":
        r"""Reads a file written by :meth:`save`.

        Args:
            path (str or Path): The file.

        Returns:
            LinkModel

        Raises:
            ValueError: If the file is not a link model.
        """
        try:
            state = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a JSON link model: {e}") from None
        if not isinstance(state, dict):
            raise ValueError(f"{path} is not a JSON link model (expected an object)")
        return cls.from_dict(state)

    def describe(self) -> str:
        r"""One line for humans, e.g. ``alpha 52.1 us/peer, beta 1.84 GB/s (gloo, 2 ranks)``.

        Returns:
            str
        """
        codec = "" if math.isinf(self.codec_throughput) else \
            f", codec {self.codec_throughput / 1e9:.2f} GB/s"
        if codec and self.codec_row_seconds:
            codec += f" + {self.codec_row_seconds * 1e9:.0f} ns/row"
        source = ", fitted to training" if self.source == "training" else ""
        overlap = f", overlap costs {self.contention:.0%} of compute" if self.contention else ""
        if self.queue_wait:
            overlap += f", a collective queues {self.queue_wait * 1e3:.0f} ms behind a transfer"
        if self.duplex_gain != 1.0:
            overlap += f", both directions at once {self.duplex_gain:.2f}x faster"
        return (f"alpha {self.alpha * 1e6:.1f} us/peer, beta {self.beta / 1e9:.3f} GB/s{codec}"
                f"{overlap} "
                f"({self.backend}, {self.world_size} rank{'s' if self.world_size != 1 else ''}, "
                f"{self.device}{source})")
