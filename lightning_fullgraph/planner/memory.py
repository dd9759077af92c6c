r"""Per-rank memory a partition and a model's exchanges need (an estimate, in bytes).

Counted, for one rank and one aggregation mode (widths from the
:class:`~.profile.ExchangeProfile`'s first training step, where every exchange happens):

* ``features``: the owned input rows, :math:`N_{own} \cdot F_{in}` values;
* ``graph``: the rank's in-edge list (``int64 [2, E]``) and, when layers run pre/hybrid
  aggregated, the mode's edge list as well (in-edges kept plus outgoing pre edges), 16 bytes
  per edge;
* ``halo``: the received rows of every forward post-channel exchange (the halo part of the
  extended source tensors, kept for backward);
* ``pre_slots``: for every forward pre-channel exchange, the rank's pre-slot rows (the tail of
  the aggregate it sends) and the partial rows it receives;
* ``activations``: the owned rows of every exchanged tensor, :math:`N_{own}` rows of its width
  (the layer inputs/outputs the exchange reads);
* ``parameters``: parameters, gradients and two optimizer moments (Adam), 4 copies.

Not counted: temporaries of the kernels (messages per edge), the optimizer's other state,
the framework's allocator overhead, labels and masks.  The estimate ranks modes and part
counts; it is not a peak-memory measurement.
"""
from typing import Dict

from .counts import RankCounts
from .profile import ExchangeProfile

__all__ = ["memory_estimate"]


def memory_estimate(profile: ExchangeProfile, counts: RankCounts) -> Dict[str, int]:
    r"""Bytes one rank needs for its graph, features, halo, pre slots and parameters.

    Args:
        profile (ExchangeProfile): The model's exchange calls (its aggregation picks the
            rank's plans).
        counts (RankCounts): The rank's plan counts.

    Returns:
        Dict[str, int]: ``features``, ``graph``, ``halo``, ``pre_slots``, ``activations``,
        ``parameters`` and their ``total``.
    """
    mode = profile.effective_mode
    out = dict(features=counts.num_owned * profile.in_channels * profile.feature_bytes,
               graph=16 * counts.num_in_edges, halo=0, pre_slots=0, activations=0,
               parameters=4 * profile.parameter_bytes)
    if mode != "post" and mode in counts.num_edges:
        out["graph"] += 16 * counts.num_edges[mode]
    for call in profile.train_first:
        if call.direction != "forward" or call.reverse:
            continue
        row = call.decoded_row_bytes
        for channel in (("post", "pre") if call.channel == "both" else (call.channel, )):
            sent, received = counts.rows(call.mode, channel, call.reverse)
            if channel == "post":
                out["halo"] += sum(received) * row
            else:
                out["pre_slots"] += (sum(sent) + sum(received)) * row
        out["activations"] += counts.num_owned * row
    out["total"] = sum(out.values())
    return out
