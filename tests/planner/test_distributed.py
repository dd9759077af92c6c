"""On gloo ranks: predicted bytes equal the engine's measured bytes, per exchange point and
direction, for every step of a run; calibration is the same on every rank; the
CommunicationMonitor logs predictions equal to its measurements (with exchange calls recorded
from the run or profiled before it, and a link given or calibrated at fit start), and fits the
same link to the run's exchanges on every rank."""
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import CommStats, ExchangeConfig, FullGraphEngine
from lightning_fullgraph.engine.codecs.registry import codec_from_name
from lightning_fullgraph.partition import MODES
from lightning_fullgraph.planner import (
    LinkModel,
    calibrate,
    partition_counts,
    predict,
    profile_model,
)
from lightning_fullgraph.testing import run_distributed

from .conftest import build, partitions

KINDS = ("gcn", "sage")
CODEC = "int2-compact"
TRAIN_STEPS, EVAL_FORWARDS = 4, 2


def _forward(model, data):  # the same input tensor every step: static caching kicks in
    return model(data.x, data.edge_index)


def _measured(engine):
    return {k: dict(calls=c.calls, rows_sent=c.rows_sent, rows_received=c.rows_received,
                    bytes_sent=c.bytes_sent, bytes_received=c.bytes_received)
            for k, c in engine.stats.counters.items()}


def _run_steps(part, kind, mode, num_features, codec=None, overlap=False):
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(aggregation=mode, codec=codec, overlap=overlap,
                                                     step_aside=False))
    model = build(kind, num_features)
    engine.attach(model)
    if overlap:  # the kernels run the split aggregations that overlap
        engine.use_kernels("auto")
    data = engine.data
    train, evals = [], []
    for _ in range(TRAIN_STEPS):
        engine.stats.reset()
        out = _forward(model, data)
        engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        train.append(_measured(engine))
    model.eval()
    with torch.no_grad():
        for _ in range(EVAL_FORWARDS):
            engine.stats.reset()
            _forward(model, data)
            evals.append(_measured(engine))
    engine.detach()
    return train, evals


def _monitor(part, kind, mode, num_features, profile, link, save_link=None, overlap=False):
    from lightning_fullgraph.callbacks import CommunicationMonitor
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=mode, overlap=overlap))
    model = build(kind, num_features)
    engine.attach(model)
    if overlap:
        engine.use_kernels("auto")
    logged = {}
    module = SimpleNamespace(log=lambda name, value, **kw: logged.__setitem__(name, value))
    trainer = SimpleNamespace(strategy=SimpleNamespace(engine=engine), datamodule=None,
                              loggers=[], state=SimpleNamespace(fn="fit"))
    monitor = CommunicationMonitor(profile=profile, link=link, save_link=save_link)
    monitor.on_fit_start(trainer, module)
    trainer.is_global_zero = engine.transport.rank == 0
    data, epochs = engine.data, []
    for _ in range(4):
        monitor.on_train_epoch_start(trainer, module)
        monitor.on_train_batch_start(trainer, module, data, 0)
        model.train()
        out = _forward(model, data)
        engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        monitor.on_train_batch_end(trainer, module, None, data, 0)
        monitor.on_validation_batch_start(trainer, module, data, 0)
        model.eval()
        with torch.no_grad():
            _forward(model, data)
        monitor.on_validation_batch_end(trainer, module, None, data, 0)
        monitor.on_train_epoch_end(trainer, module)
        epochs.append(dict(logged))
    # The exposed seconds per call: none where the work in flight outlasts every transfer,
    # all of it where nothing ran in flight (this rank's view, before the reduction).
    tracker, stats = monitor.predictor, CommStats()
    for call in tracker.profile.train_steady:
        stats.add_seconds(call.key, call.direction, 0.0, in_flight=1e3)
    hidden = tracker.step_seconds(stats).view(-1, 4)
    bare = tracker.step_seconds().view(-1, 4)
    terms = dict(hidden=hidden[:, 2].sum().item(), exchange=bare[:, 0].sum().item(),
                 bare=(bare[:, 2] - bare[:, 0]).abs().max().item(),
                 bare_link=bare[:, 3].sum().item(), hidden_link=hidden[:, 3].sum().item())
    # Background transfers (the pipeline's, waited for a step later): out of the link term;
    # exposed only to the backlog of a link slower than their shared window.
    ahead, behind = CommStats(), CommStats()
    for call in tracker.profile.train_steady:
        ahead.add_seconds(call.key, call.direction, 0.0, in_flight=1e3, background=True)
        behind.add_seconds(call.key, call.direction, 0.0, in_flight=0.0, background=True)
    # The step's collectives outside the exchange (engine.backward's presence agreement and
    # its one gradient bucket) queue behind them, each for the link's queue wait, as far as
    # the link is busy with them: all of the time a step waits for them at once, a tiny
    # share of a window of 1,000 s, all of a step they outlast.
    queued = replace(tracker.link, queue_wait=0.5)
    terms.update(collectives=tracker.step_collectives(),
                 queued_ahead=_exposed(tracker, queued, ahead),
                 queued_behind=_exposed(tracker, queued, behind),
                 queued_short_step=_exposed(tracker, queued, ahead, step=1e-9))
    ahead = tracker.step_seconds(ahead, collectives=0).view(-1, 4)
    behind = tracker.step_seconds(behind, collectives=0).view(-1, 4)
    terms.update(ahead_exposed=ahead[:, 2].sum().item(), ahead_link=ahead[:, 3].sum().item(),
                 behind_exposed=behind[:, 2].sum().item(), behind_link=behind[:, 3].sum().item())
    monitor.on_fit_end(trainer, module)
    assert not any("_send" in ex.__dict__ or "_transfer_async" in ex.__dict__
                   for ex in engine.exchanges.values())  # unwrapped
    engine.detach()
    fitted = monitor.fitted_link.to_dict() if monitor.fitted_link is not None else None
    own = [h["comm/step_compute_s"] for h in monitor.history]  # this rank's, per epoch
    return dict(epochs=epochs, fitted=fitted, terms=terms, own_compute=own)


def _exposed(tracker, link, stats, **kwargs):
    r"""The predicted exposed seconds of one step on :obj:`link` instead of the tracker's."""
    own, tracker.link = tracker.link, link
    try:
        return tracker.step_seconds(stats, **kwargs).view(-1, 4)[:, 2].sum().item()
    finally:
        tracker.link = own


def _rank(rank, world_size, profiles, save_link):
    data, parts = partitions(world_size)
    part = parts[rank]
    link = calibrate(sizes=(0, 1 << 14, 1 << 18), repeats=3, warmup=1, codec_rows=256)
    runs = {(kind, mode): _run_steps(part, kind, mode, data.num_features)
            for kind in KINDS for mode in MODES}
    # A lossy codec's wire rows (the compact int2 header: 4 bytes + ceil(F / 4) per row).
    runs[("gcn", "hybrid", CODEC)] = _run_steps(part, "gcn", "hybrid", data.num_features, CODEC)
    # Overlapped exchanges start their transfers asynchronously: the same bytes.
    overlapped = {(kind, mode): _run_steps(part, kind, mode, data.num_features, overlap=True)
                  for kind in KINDS for mode in MODES}
    monitored = {}
    if world_size == 2:  # once: importing Lightning in every rank costs seconds
        monitored = {
            "recorded": _monitor(part, "gcn", "hybrid", data.num_features, None, link),
            # Recorded from overlapped (asynchronous) transfers.
            "recorded, overlap": _monitor(part, "sage", "post", data.num_features, None, link,
                                          overlap=True),
            "profiled": _monitor(part, "sage", "pre", data.num_features,
                                 profiles[("sage", "pre")], "calibrate", save_link),
        }
    return dict(link=link.to_dict(), runs=runs, overlapped=overlapped, monitored=monitored)


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_predicted_bytes_equal_measured_bytes(world_size, tmp_path):
    data, parts = partitions(world_size)
    profiles = {(kind, mode): profile_model(build(kind, data.num_features), data.num_features,
                                            aggregation=mode, forward=_forward)
                for kind in KINDS for mode in MODES}
    profiles[("gcn", "hybrid", CODEC)] = profile_model(
        build("gcn", data.num_features), data.num_features, aggregation="hybrid",
        forward=_forward, codec=codec_from_name(CODEC))
    save_link = tmp_path / "fitted.json"
    results = run_distributed(_rank, world_size, profiles, str(save_link), timeout_s=300)
    counts = partition_counts(parts)

    # Calibration: positive, finite and identical on every rank.
    links = [LinkModel.from_dict(r["link"]) for r in results]
    assert all(link == links[0] for link in links)
    assert links[0].world_size == world_size and links[0].backend == "gloo"
    assert all(0 < v < float("inf") for v in (links[0].alpha, links[0].beta,
                                               links[0].codec_throughput))

    for case, profile in profiles.items():
        for step in range(TRAIN_STEPS):
            pred = predict(profile, counts, train_offset=step)
            for rank, r in enumerate(results):
                assert pred.per_key(rank) == r["runs"][case][0][step], \
                    (case, "train step", step, rank)
        for step in range(EVAL_FORWARDS):
            pred = predict(profile, counts, train_steps=0, eval_forwards=1, eval_offset=step)
            for rank, r in enumerate(results):
                assert pred.per_key(rank) == r["runs"][case][1][step], \
                    (case, "eval forward", step, rank)
    for case, (train, evals) in results[0]["overlapped"].items():
        for rank, r in enumerate(results):
            assert r["overlapped"][case] == r["runs"][case], (case, "overlap", rank)
    lossy = results[0]["runs"][("gcn", "hybrid", CODEC)][0][-1]
    exact = results[0]["runs"][("gcn", "hybrid")][0][-1]
    assert sum(c["bytes_sent"] for c in lossy.values()) \
        < sum(c["bytes_sent"] for c in exact.values()) / 2  # the codec was in use

    for name, monitored in results[0]["monitored"].items():
        for logged in monitored["epochs"]:
            assert logged["comm/predicted_sent_MB"] == pytest.approx(logged["comm/sent_MB"],
                                                                     rel=1e-12), name
            assert logged["comm/predicted_received_MB"] == pytest.approx(
                logged["comm/received_MB"], rel=1e-12), name
            assert logged["comm/predicted_sent_MB_max"] == pytest.approx(
                logged["comm/sent_MB_max"], rel=1e-12), name
            assert logged["comm/predicted_exchange_s"] > 0, name
    for name in results[0]["monitored"]:
        # The same on every rank: the per-exchange maxima are reduced over ranks.
        for figure in ("exchange_s", "step_exchange_s", "step_codec_s", "step_exposed_s"):
            last = [r["monitored"][name]["epochs"][-1][f"comm/predicted_{figure}"]
                    for r in results]
            assert all(s == last[0] for s in last), (name, figure)
        logged = results[0]["monitored"][name]["epochs"][-1]
        assert logged["comm/predicted_step_exchange_s"] > 0, name
        # Overlap: the part of the transfers the work in flight does not cover is exposed;
        # without it (synchronous exchanges) all of it is.
        exposed, exchange = (logged[f"comm/predicted_step_{f}_s"] for f in ("exposed",
                                                                             "exchange"))
        if "overlap" in name:
            assert logged["comm/in_flight_s"] > 0 and 0 <= exposed < exchange, name
        else:
            assert logged["comm/in_flight_s"] == 0 and exposed == exchange, name
        for r in results:
            terms = r["monitored"][name]["terms"]
            assert terms["exchange"] > 0 and terms["hidden"] == 0 and terms["bare"] == 0, name
            # Transfers the step waits for all count in its link term, hidden or not.
            assert terms["bare_link"] == terms["hidden_link"] == pytest.approx(
                terms["exchange"]), name
            assert terms["ahead_exposed"] == terms["ahead_link"] == 0, name
            assert terms["behind_link"] == 0, name
            assert terms["behind_exposed"] == pytest.approx(terms["exchange"]), name
            assert terms["collectives"] == 2, name
            assert terms["queued_behind"] == pytest.approx(terms["exchange"] + 2 * 0.5), name
            assert terms["queued_ahead"] == pytest.approx(2 * 0.5 * terms["exchange"] / 1e3), \
                name
            assert terms["queued_short_step"] == pytest.approx(2 * 0.5), name
        assert logged["comm/step_exchange_s"] + logged["comm/step_compute_s"] \
            == pytest.approx(logged["comm/step_s"]), name
        assert logged["comm/step_exchange_s"] <= logged["comm/exchange_s"], name
        # The least compute over ranks (the planner's compute: the others' includes their
        # wait at the gradient all-reduce), the same on every rank, each epoch.
        for epoch, own in enumerate(zip(*(r["monitored"][name]["own_compute"]
                                          for r in results))):
            least = [r["monitored"][name]["epochs"][epoch]["comm/step_compute_s_min"]
                     for r in results]
            assert least == [min(own)] * len(results), (name, epoch)
    if results[0]["monitored"]:
        # The step's terms are the planner's for one steady training step on the given link
        # (the identity codec's throughput as calibrated); with a calibrated link and no
        # lossy codec, no codec time.
        step = predict(profiles[("gcn", "hybrid")], counts, links[0], train_steps=1,
                       eval_forwards=0)
        logged = results[0]["monitored"]["recorded"]["epochs"][-1]
        assert logged["comm/predicted_step_exchange_s"] == pytest.approx(step.seconds)
        assert logged["comm/predicted_step_codec_s"] == pytest.approx(step.codec_seconds)
        assert results[0]["monitored"]["profiled"]["epochs"][-1][
            "comm/predicted_step_codec_s"] == 0.0
        # The link's contention (compute lost to transfers in flight) is logged with the
        # step's terms: the given link's (not measured: 0), or the one calibrated at fit
        # start (measured, the same on every rank).
        assert logged["comm/link_contention"] == links[0].contention == 0.0
        calibrated = [r["monitored"]["profiled"]["epochs"][-1]["comm/link_contention"]
                      for r in results]
        assert calibrated == [calibrated[0]] * len(results) and 0.0 <= calibrated[0] < 1.0
        # No duplex transport: no gain measured, none applied (tests/planner/test_duplex.py).
        assert logged["comm/link_duplex_gain"] == 1.0
        assert results[0]["monitored"]["profiled"]["epochs"][-1]["comm/link_duplex_gain"] == 1.0
        # The link fitted to the run: none from the first epoch (one-time exchanges), then
        # the same on every rank (fitted from reduced values only), logged and saved.
        first = results[0]["monitored"][name]["epochs"][0]
        assert "comm/fitted_latency_us" not in first, name
        fitted = [r["monitored"][name]["fitted"] for r in results]
        assert fitted[0] is not None and all(f == fitted[0] for f in fitted), name
        link = LinkModel.from_dict(fitted[0])
        assert (link.source, link.world_size, link.backend) == ("training", 2, "gloo"), name
        assert link.samples, name
        logged = results[0]["monitored"][name]["epochs"][-1]
        assert logged["comm/fitted_latency_us"] == pytest.approx(link.alpha * 1e6), name
        assert logged["comm/fitted_bandwidth_GBps"] == pytest.approx(link.beta / 1e9), name
    if world_size == 2:
        assert LinkModel.load(save_link) == LinkModel.from_dict(
            results[0]["monitored"]["profiled"]["fitted"])
