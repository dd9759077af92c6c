r"""Communication model and planner: predict what the halo exchange moves and costs.

SuperGCN's communication model (ICS'25, Eqs. 2-8) applied to this library's aggregation
plans: for a partition, a model and a measured link, predict per layer and per epoch the rows,
bytes and seconds of the exchange in post-, pre- and hybrid aggregation, and the memory each
rank needs -- before training, for several part counts (``lightning-fullgraph plan``), or next
to the measured figures while training
(:class:`~lightning_fullgraph.callbacks.CommunicationMonitor`).

* :mod:`.link` / :mod:`.calibrate`: latency, bandwidth and codec throughput of the actual
  process group (:class:`LinkModel`, :func:`calibrate`, :func:`calibrate_local`);
* :mod:`.fit`: the same fitted to the exchanges of a run, as training meets the link
  (:func:`fit_link`, :func:`observations`);
* :mod:`.profile`: what a model exchanges per step (:func:`profile_model`,
  :class:`ExchangeProfile`, :class:`ExchangeRecorder`);
* :mod:`.counts`: the plans as rows per rank, channel and peer (:class:`RankCounts`);
* :mod:`.model` / :mod:`.memory`: the predictions (:class:`CommunicationModel`,
  :func:`predict`, :func:`memory_estimate`);
* :mod:`.tracker`: per-epoch predictions of a running engine (:class:`PredictionTracker`);
* :mod:`.step`: a step's seconds from a measured compute and those predictions
  (:func:`predicted_step_seconds`);
* :mod:`.sweep` / :mod:`.plot`: the ``plan`` command's sweep over part counts and its figure.

Example::

    profile = profile_model(GCN(1433, 16, 2, 7), aggregation="hybrid")
    counts = partition_counts(partition_graph(data, 4))
    link = calibrate_local(2)
    print(predict(profile, counts, link).summary())
"""
from .calibrate import (DEFAULT_SIZES, calibrate, calibrate_codec, calibrate_codec_costs,
                        calibrate_contention, calibrate_local, calibrate_queue_wait)
from .counts import RankCounts, partition_counts
from .fit import fit_link, observations
from .link import LinkModel
from .memory import memory_estimate
from .model import CommunicationModel, PointPrediction, Prediction, predict
from .profile import ExchangeCall, ExchangeProfile, ExchangeRecorder, profile_model
from .step import predicted_step_seconds
from .tracker import PredictionTracker

__all__ = [
    "LinkModel",
    "calibrate",
    "calibrate_codec",
    "calibrate_codec_costs",
    "calibrate_contention",
    "calibrate_queue_wait",
    "calibrate_local",
    "DEFAULT_SIZES",
    "fit_link",
    "observations",
    "ExchangeCall",
    "ExchangeProfile",
    "ExchangeRecorder",
    "profile_model",
    "RankCounts",
    "partition_counts",
    "memory_estimate",
    "CommunicationModel",
    "Prediction",
    "PointPrediction",
    "predict",
    "PredictionTracker",
    "predicted_step_seconds",
]
