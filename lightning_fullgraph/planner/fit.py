r"""The link as training meets it: latency and bandwidth fitted to the exchanges of a run.

:func:`~.calibrate.calibrate` measures the link with a ping-pong of its own.  Where ranks
share cores with their own threads and the backend's (two processes on two cores here),
exchanges inside training cost more than the ping-pong sees: a rank leaves compute for the
exchange, its peer's threads and its own are woken, and some of those wake-ups wait for a
scheduler slice of milliseconds.  Measured at P = 2 on Cora (``python -m benchmarks planner``),
training's exchanges took 1.2-2.4x the ping-pong's prediction, run after run, while the same
exchanges replayed back to back took what it predicted.

:func:`fit_link` takes what the engine measured instead.  Every observation is one exchange
point of one epoch: how many exchanges it made, the bytes of its busiest rank (summed over
them, :attr:`~.model.PointPrediction.busiest_bytes`) and the seconds the exchange took: from
the last rank's arrival to the last rank's departure where its exchanges were synchronous
(:func:`~.tracker.exchange_span`: an all-to-all is not over when the last rank to arrive
leaves, its peers with more to move leave later and the step waits for them), else the time of
the rank that arrived last, which waited for no one's compute.  The model is the planner's,
:math:`t = n (P - 1) \alpha + B / \beta`, fitted by least squares with both coefficients
non-negative.  Where the observations do not tell the bandwidth apart -- all exchanges of about
the same size, or all latency-bound (a small graph: moving the largest one takes less than its
latency at the prior's bandwidth) -- the bandwidth of a :obj:`prior` link (the ping-pong's) is
kept and only the latency is fitted.

A link fitted on some exchange sets predicts others: fitted on the post-aggregation epochs of
a run it predicts hybrid and pre aggregation (other calls, other bytes); saved
(:meth:`~.link.LinkModel.save`), it is what ``lightning-fullgraph plan --link`` reads.
"""
import math
from typing import Iterable, List, Optional, Sequence, Tuple

from .link import LinkModel

__all__ = ["fit_link", "observations"]

#: A fitted bandwidth must rest on byte counts that differ at least this much (max / min of
#: the per-exchange bytes), else it is noise on a latency-bound link.
MIN_BYTES_SPREAD = 4.0


def observations(prediction, seconds: dict) -> List[Tuple[int, int, float]]:
    r"""Observations for :func:`fit_link` from one epoch.

    Args:
        prediction (Prediction): The planner's prediction of that epoch (calls and busiest
            bytes of every exchange point; no link needed).
        seconds (dict): Measured seconds per ``(key, direction)``: the time of the rank that
            arrived last (the smallest over ranks).

    Returns:
        List[Tuple[int, int, float]]: ``(calls, busiest bytes, seconds)`` per exchange point
        that was measured.

    Raises:
        ValueError: If a measured point is not in the prediction (another model or plan).
    """
    points = {(p.key, p.direction): p for p in prediction.points}
    unknown = sorted(set(seconds) - set(points))
    if unknown:
        raise ValueError(f"measured exchange points {unknown} are not in the prediction")
    return [(points[k].calls, points[k].busiest_bytes, float(s)) for k, s in seconds.items()
            if points[k].calls]


def _solve(rows: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    r"""Least squares of ``t = a x + b y`` with ``a, b >= 0`` (two unknowns: the
    unconstrained solution, else the best one-coefficient fit)."""
    sxx = sum(x * x for x, _, _ in rows)
    syy = sum(y * y for _, y, _ in rows)
    sxy = sum(x * y for x, y, _ in rows)
    sxt = sum(x * t for x, _, t in rows)
    syt = sum(y * t for _, y, t in rows)
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * sxx * syy:
        a, b = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
        if a >= 0 and b >= 0:
            return a, b

    def loss(a: float, b: float) -> float:
        return sum((t - a * x - b * y) ** 2 for x, y, t in rows)
    only_a = (max(sxt / sxx, 0.0), 0.0) if sxx else (0.0, 0.0)
    only_b = (0.0, max(syt / syy, 0.0)) if syy else (0.0, 0.0)
    return min(only_a, only_b, key=lambda ab: loss(*ab))


def fit_link(samples: Iterable[Tuple[int, int, float]], world_size: int,
             prior: Optional[LinkModel] = None, *, backend: Optional[str] = None,
             device: Optional[str] = None) -> LinkModel:
    r"""Latency and bandwidth fitted to measured exchanges.

    Args:
        samples (Iterable[Tuple[int, int, float]]): ``(exchanges, busiest rank's bytes,
            seconds)`` per observation (:func:`observations`), e.g. every exchange point of
            every steady-state epoch so far.
        world_size (int): Ranks of the group (at least 2).
        prior (LinkModel, optional): A ping-pong calibration of the same group: its bandwidth
            is kept when the samples cannot tell it (and its codec throughput, contention,
            queue wait and duplex gain always).
        backend (str, optional): The group's backend (default: the prior's, else
            ``"unknown"``).
        device (str, optional): Device of the exchanged tensors (default: the prior's, else
            ``"cpu"``).

    Returns:
        LinkModel: ``source="training"``; its :attr:`~.LinkModel.samples` are the observations
        as ``(bytes per exchange, seconds per exchange)``.

    Raises:
        ValueError: Without samples, with fewer than 2 ranks, or if every exchange was
            measured at zero seconds.
    """
    samples = [(int(n), int(b), float(t)) for n, b, t in samples if int(n) > 0]
    if world_size < 2:
        raise ValueError(f"fitting a link needs at least 2 ranks, got {world_size}")
    if not samples:
        raise ValueError("fit_link needs at least one observed exchange")
    if any(t < 0 or math.isnan(t) for _, _, t in samples):
        raise ValueError("measured seconds must be non-negative numbers")
    peers = world_size - 1
    per_call = [b / n for n, b, _ in samples]
    spread = max(per_call) / min(per_call) if min(per_call) > 0 else math.inf
    # The bytes tell a bandwidth apart only if they differ, and if moving the largest
    # exchange takes at least as long as its latency (else the slope is the latency's noise).
    visible = prior is None or (spread >= MIN_BYTES_SPREAD
                                and max(per_call) / prior.beta >= prior.alpha * peers)
    if visible:
        a, inv_beta = _solve([(n * peers, b, t) for n, b, t in samples])
        if not a > 0 and not inv_beta > 0:
            raise ValueError("the observed exchanges took no time: nothing to fit")
        # A slope at or below zero is noise on a link faster than the samples tell apart.
        beta = 1.0 / inv_beta if inv_beta > 0 else 1e15
    else:
        beta = prior.beta
        rest = [(n * peers, t - b / beta) for n, b, t in samples]
        a = sum(x * r for x, r in rest) / sum(x * x for x, _ in rest)
        if not a > 0 and not any(t > 0 for _, _, t in samples):
            raise ValueError("the observed exchanges took no time: nothing to fit")
    a = max(a, 1e-9)  # all of the time in the bytes: a latency below the clock's
    return LinkModel(alpha=a, beta=beta,
                     codec_throughput=prior.codec_throughput if prior is not None else math.inf,
                     world_size=int(world_size),
                     backend=backend or (prior.backend if prior is not None else "unknown"),
                     device=device or (prior.device if prior is not None else "cpu"),
                     samples=[(b // n, t / n) for n, b, t in samples],
                     codec=prior.codec if prior is not None else "IdentityCodec",
                     source="training",
                     contention=prior.contention if prior is not None else 0.0,
                     codec_row_seconds=prior.codec_row_seconds if prior is not None else 0.0,
                     queue_wait=prior.queue_wait if prior is not None else 0.0,
                     duplex_gain=prior.duplex_gain if prior is not None else 1.0)
