r"""The planner's step time: a measured compute plus the exchange a configuration adds.

The exchange seconds of one training step come from the link model
(:meth:`~.tracker.PredictionTracker.step_seconds`, logged by the
:class:`~lightning_fullgraph.callbacks.CommunicationMonitor` as
``comm/predicted_step_exchange_s``, ``_exposed_s``, ``_link_s`` and ``_codec_s``); the compute
cannot be predicted from the graph alone and is measured on a reference run (usually exact
post): its step without the exchange it blocked in, least over ranks
(``comm/step_compute_s_min``).

Overlap hides a transfer behind compute, but it does not make it free: moving the bytes takes
the same cores (the transport's threads, the kernel's network stack, copies), and a step
computes more slowly while its transfers are in flight -- by the link's
:attr:`~.link.LinkModel.contention` :math:`\kappa`, measured at calibration.  The reference's
compute is therefore first taken back to what it would be with nothing in flight, then slowed
again by what the configuration keeps in flight beside it.  A transfer left in flight past the
step (the asynchronous pipeline's) also delays the step's own collectives, which queue behind
its bytes: that wait is part of the configuration's exposed seconds
(:meth:`~.tracker.PredictionTracker.step_seconds`, at the link's
:attr:`~.link.LinkModel.queue_wait`).
"""
from typing import Optional

__all__ = ["predicted_step_seconds"]


def predicted_step_seconds(compute: float, exchange: float, exposed: Optional[float] = None,
                           link: Optional[float] = None, codec: float = 0.0,
                           contention: float = 0.0, reference_hidden: float = 0.0) -> float:
    r"""One training step's predicted seconds.

    With :math:`C_{ref}` the reference's measured compute, :math:`H_{ref}` the seconds its
    transfers were in flight beside it (its exchange less its exposed part), and, for the
    configuration, :math:`X` its exchange seconds, :math:`E` their exposed part,
    :math:`H = X - E` the hidden part, :math:`L` the seconds the link is busy with transfers
    the step waits for and :math:`Q` its codec's seconds:

    .. math::
        C_0 = C_{ref} - \kappa \min(H_{ref}, C_{ref}), \qquad
        C = \min\Big(C_0 + \kappa H,\ \frac{C_0}{1 - \kappa}\Big), \qquad
        t = Q + \max(C + E,\ L)

    (a transfer in flight for longer than the whole compute slows it no further than a link
    busy throughout: :math:`C = C_0 + \kappa C`).  A step cannot take less than the link is
    busy with the transfers it waits for, however much of them overlaps.

    Args:
        compute (float): :math:`C_{ref}`, the reference's measured compute seconds.
        exchange (float): :math:`X`, the configuration's predicted exchange seconds.
        exposed (float, optional): :math:`E` (default: all of :obj:`exchange`: nothing hidden).
        link (float, optional): :math:`L` (default: :obj:`exchange`).
        codec (float): :math:`Q`.
        contention (float): :math:`\kappa` in ``[0, 1)``
            (:attr:`~.link.LinkModel.contention`; ``0``: overlap taken as free).
        reference_hidden (float): :math:`H_{ref}`.

    Returns:
        float: Seconds.
    """
    if not 0.0 <= contention < 1.0:
        raise ValueError(f"contention must be in [0, 1), got {contention}")
    exposed = exchange if exposed is None else exposed
    link = exchange if link is None else link
    hidden = max(0.0, exchange - exposed)
    alone = max(0.0, compute - contention * min(max(0.0, reference_hidden), compute))
    slowed = min(alone + contention * hidden, alone / (1.0 - contention))
    return codec + max(slowed + exposed, link)
