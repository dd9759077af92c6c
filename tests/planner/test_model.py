"""The communication model on a small partitioned graph: rows, bytes, seconds, memory."""
import math
from dataclasses import replace

import pytest
import torch.nn.functional as F

from lightning_fullgraph.partition import MODES, partition_stats
from lightning_fullgraph.planner import (
    CommunicationModel,
    LinkModel,
    RankCounts,
    memory_estimate,
    partition_counts,
    predict,
    profile_model,
)

from .conftest import build


def _forward(model, data):
    return model(F.dropout(data.x, 0.5, model.training), data.edge_index)


def test_counts_are_the_plans_counts(parts3):
    data, parts = parts3
    counts = partition_counts(parts)
    stats = partition_stats(parts)
    for part, c in zip(parts, counts):
        assert (c.rank, c.world_size, c.num_owned) == (part.rank, 3, part.num_owned)
        for mode in MODES:
            plan = part.plan(mode)
            for channel in ("post", "pre"):
                ch = getattr(plan, channel)
                assert c.rows(mode, channel) == (ch.send_counts.tolist(), ch.recv_counts.tolist())
                assert c.rows(mode, channel, reverse=True) == (ch.recv_counts.tolist(),
                                                               ch.send_counts.tolist())
            assert c.num_halo[mode] == plan.num_halo
            assert c.num_pre_slots[mode] == plan.num_pre_slots
            assert c.num_edges[mode] == plan.edge_index.size(1)
    for mode in MODES:
        assert sum(c.rows_per_exchange(mode) for c in counts) == stats.mode_rows[mode]
    assert RankCounts.from_dict(counts[1].to_dict()) == counts[1]


def test_hybrid_never_moves_more_rows_than_either_pure_mode(parts3):
    _, parts = parts3
    counts = partition_counts(parts)
    for c in counts:
        for s in range(3):
            rows = {m: c.recv[f"{m}.post"][s] + c.recv[f"{m}.pre"][s] for m in MODES}
            assert rows["hybrid"] <= min(rows["pre"], rows["post"])
    total = {m: sum(c.rows_per_exchange(m) for c in counts) for m in MODES}
    assert total["hybrid"] < min(total["pre"], total["post"])  # strictly, on this graph


def test_bytes_are_rows_times_row_bytes(parts3):
    data, parts = parts3
    counts = partition_counts(parts)
    profile = profile_model(build("gcn", data.num_features), data.num_features,
                            aggregation="post", forward=_forward)
    pred = predict(profile, counts, train_offset=0)  # first step: degrees too
    for r, c in enumerate(counts):
        send, recv = sum(c.send["post.post"]), sum(c.recv["post.post"])
        # forward: 16- and 4-wide rows and one degree (both layers share their
        # normalization); backward: the gradients come back
        assert pred.bytes_sent("forward")[r] == 4 * send * (16 + 4 + 1)
        assert pred.bytes_received("forward")[r] == 4 * recv * (16 + 4 + 1)
        assert pred.bytes_sent("backward")[r] == 4 * recv * (16 + 4)
        assert pred.rows_sent("backward")[r] == 2 * recv
    steady = predict(profile, counts)
    assert steady.bytes_sent("forward") == [4 * sum(c.send["post.post"]) * 20 for c in counts]
    assert steady.rows_per_exchange == sum(c.rows_per_exchange("post") for c in counts)
    assert steady.seconds is None and steady.summary()["exchange_seconds"] is None


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_hybrid_bytes_at_most_pure_modes(parts3, kind):
    data, parts = parts3
    counts = partition_counts(parts)
    total = {}
    for mode in MODES:
        profile = profile_model(build(kind, data.num_features), data.num_features,
                                aggregation=mode, forward=_forward)
        total[mode] = predict(profile, counts).summary()["bytes_per_epoch_total"]
    assert total["hybrid"] <= min(total["pre"], total["post"])


def test_seconds_follow_the_busiest_rank(parts3):
    data, parts = parts3
    counts = partition_counts(parts)
    profile = profile_model(build("sage", data.num_features), data.num_features,
                            aggregation="hybrid", forward=_forward)
    link = LinkModel(alpha=1e-4, beta=1e9, codec_throughput=1e10, world_size=2,
                     backend="gloo")
    pred = CommunicationModel(profile, link).predict(counts, train_steps=2, eval_forwards=1)
    expect = 0.0
    calls = profile.calls(2, 1)
    for call, times in calls.items():
        worst = max(max(sum(s), sum(r)) * call.row_bytes
                    for s, r in (c.rows(call.mode, call.channel, call.reverse) for c in counts))
        expect += times * (1e-4 * 2 + worst / 1e9)
    assert pred.seconds == pytest.approx(expect)
    assert pred.codec_seconds > 0
    # A row term adds its rows' cost, per call, on the rank that codes most.
    rowed = CommunicationModel(profile, replace(link, codec_row_seconds=1e-6)).predict(
        counts, train_steps=2, eval_forwards=1)
    assert rowed.seconds == pytest.approx(expect)
    assert rowed.codec_seconds > pred.codec_seconds
    assert pred.summary()["exchanges"] == sum(calls.values())
    layers = pred.layers()
    assert set(layers) == {"convs.0", "convs.1"}
    assert sum(d["seconds"] for entry in layers.values() for d in entry.values()) \
        == pytest.approx(expect)


def test_inter_host_bytes(parts3):
    data, parts = parts3
    counts = partition_counts(parts)
    profile = profile_model(build("gcn", data.num_features), data.num_features,
                            aggregation="post", forward=_forward)
    flat = predict(profile, counts)
    assert flat.summary()["inter_host_bytes"] is None
    split = predict(profile, counts, hosts=3)  # every rank its own host: all bytes cross
    assert split.inter_host_bytes == sum(flat.bytes_sent())
    with pytest.raises(ValueError, match="divisor"):
        predict(profile, counts, hosts=2)
    with pytest.raises(ValueError, match="every rank"):
        predict(profile, counts[:2])


def test_memory_estimate(parts3):
    data, parts = parts3
    counts = partition_counts(parts)
    for mode in MODES:
        profile = profile_model(build("gcn", data.num_features), data.num_features,
                                aggregation=mode, forward=_forward)
        for c in counts:
            mem = memory_estimate(profile, c)
            assert mem["features"] == c.num_owned * data.num_features * 4
            assert mem["parameters"] == 4 * profile.parameter_bytes
            assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
            if mode == "post":
                assert mem["pre_slots"] == 0
                # both layers' rows and one degree (the layers share their normalization)
                assert mem["halo"] == c.num_halo["post"] * 4 * (16 + 4 + 1)
            if mode == "pre":
                assert mem["halo"] == 0 and mem["pre_slots"] > 0
            assert mem["graph"] >= 16 * c.num_in_edges


def test_link_model_round_trip_and_validation(tmp_path):
    link = LinkModel(alpha=2e-5, beta=3e9, world_size=4, backend="gloo",
                     samples=[(0, 6e-5), (1 << 20, 4e-4)])
    assert math.isinf(link.codec_throughput) and link.codec_seconds(1e6, 1e6) == 0.0
    again = LinkModel.load(link.save(tmp_path / "link.json"))
    assert again == link
    assert link.exchange_seconds(3e9, 4) == pytest.approx(3 * 2e-5 + 1.0)
    assert link.exchange_seconds(1e9, 1) == 0.0
    with pytest.raises(ValueError, match="positive"):
        LinkModel(alpha=0.0, beta=1.0)
    with pytest.raises(ValueError, match="unknown"):
        LinkModel.from_dict({"alpha": 1.0, "beta": 1.0, "latency": 3})
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON link model"):
        LinkModel.load(tmp_path / "bad.json")
    # The compute lost to transfers in flight: kept, said, bounded; a file from before the
    # field takes overlap as free.
    contended = LinkModel(alpha=2e-5, beta=3e9, contention=0.35)
    assert LinkModel.load(contended.save(tmp_path / "c.json")).contention == 0.35
    assert "overlap costs 35% of compute" in contended.describe()
    assert "overlap" not in link.describe() and link.contention == 0.0
    old = link.to_dict()
    del old["contention"]
    assert LinkModel.from_dict(old) == link
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="contention must be in"):
            LinkModel(alpha=1.0, beta=1.0, contention=bad)
    # A codec's cost per row on top of its bytes: kept, said, counted once per row encoded
    # and once per row decoded; a file from before the field prices the bytes alone.
    coded = LinkModel(alpha=2e-5, beta=3e9, codec_throughput=1e9, codec_row_seconds=4e-8)
    assert LinkModel.load(coded.save(tmp_path / "r.json")) == coded
    assert "+ 40 ns/row" in coded.describe()
    assert coded.codec_seconds(2e6, 2e6) == pytest.approx(2e-3)
    assert coded.codec_seconds(2e6, 2e6, 1e5, 3e5) == pytest.approx(2e-3 + 4e5 * 4e-8 / 2)
    old = coded.to_dict()
    del old["codec_row_seconds"]
    assert LinkModel.from_dict(old).codec_row_seconds == 0.0
    for bad in (-1e-9, math.inf):
        with pytest.raises(ValueError, match="codec_row_seconds"):
            LinkModel(alpha=1.0, beta=1.0, codec_row_seconds=bad)


@pytest.mark.parametrize("policy, what", [
    ("adaptive", "per-node bit widths"),
])
def test_tracker_refuses_what_the_planner_does_not_model(policy, what):
    # Per-node widths are not in the plans: no predicted figures rather than wrong ones, with
    # a warning saying why (the same on every rank: the policy decides, before any
    # collective).  Boundary sampling is modelled (tests/planner/test_sampled.py).
    from types import SimpleNamespace

    from lightning_fullgraph.engine import ExchangePolicy
    from lightning_fullgraph.planner.tracker import PredictionTracker
    policy = ExchangePolicy(sampling=0.5) if policy == "sampling" else ExchangePolicy.of(policy)
    engine = SimpleNamespace(policy=policy)
    with pytest.warns(UserWarning, match=what):
        assert PredictionTracker.start(engine, link="calibrate") is None


def test_tracker_measures_the_codec_a_link_from_a_file_lacks():
    # A link loaded from a file (e.g. fitted to an exact run: the identity codec) gets the
    # run's lossy codec's throughput measured at start; a link that has it is kept as it is.
    import math

    from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
    from lightning_fullgraph.planner import LinkModel
    from lightning_fullgraph.planner.tracker import PredictionTracker

    from .conftest import partitions
    _, parts = partitions(1)
    fitted = LinkModel(alpha=1e-4, beta=1e8)
    assert fitted.codec == "IdentityCodec" and math.isinf(fitted.codec_throughput)
    engine = FullGraphEngine(parts[0], exchange=ExchangeConfig(codec="int2-compact"))
    tracker = PredictionTracker.start(engine, link=fitted)
    codec = next(c for c in engine.policy.codecs() if not c.lossless)
    assert tracker.link.codec == type(codec).__name__ != "IdentityCodec"
    assert 0 < tracker.link.codec_throughput < math.inf
    assert (tracker.link.alpha, tracker.link.beta) == (fitted.alpha, fitted.beta)
    tracker.close()
    exact = FullGraphEngine(parts[0])
    tracker = PredictionTracker.start(exact, link=fitted)
    assert tracker.link is fitted
    tracker.close()


def test_tracker_windows_are_the_training_steps_own():
    # The halo cache exchanges synchronously in training but overlaps in evaluation: the
    # windows the planner hides training's transfers behind are those measured between a
    # training step's start and end, not evaluation's.
    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.planner import LinkModel
    from lightning_fullgraph.planner.tracker import PredictionTracker

    from .conftest import partitions
    _, parts = partitions(1)
    engine = FullGraphEngine(parts[0])
    tracker = PredictionTracker.start(engine, link=LinkModel(alpha=1e-4, beta=1e8))
    stats = engine.stats
    for epoch in range(2):
        tracker.epoch_start()
        tracker.step_start("train")
        stats.add_seconds("x1", "forward", 0.1, in_flight=0.5)  # overlapped in training
        stats.record("x2", "forward", bytes_sent=8, bytes_received=8, rows_sent=1,
                     rows_received=1, seconds=0.2)  # synchronous in training
        stats.add_seconds("bg", "backward", 0.0, in_flight=3.0, background=True)
        tracker.step_end("train")
        tracker.step_start("eval")
        stats.add_seconds("x1", "forward", 0.0, in_flight=9.0)
        stats.add_seconds("x2", "forward", 0.0, in_flight=9.0)  # overlapped in evaluation
        tracker.step_end("eval")
        windows = tracker.training_windows().counters
        assert windows[("x2", "forward")].waits == 0  # no window: evaluation's is not its
        assert (windows[("x1", "forward")].in_flight_seconds,
                windows[("x1", "forward")].waits) == (0.5, 1)
        bg = windows[("bg", "backward")]
        assert (bg.waits, bg.background_waits, bg.background_in_flight_seconds) == (1, 1, 3.0)
        assert stats.counters[("x2", "forward")].waits == 1 + epoch  # evaluation's, not here
    tracker.close()


def test_tracker_records_the_calls_again_when_the_stages_change():
    # Step aside's arms and decision change the exchanges' stages (run_stages): a recorded
    # profile records the calls again until they repeat, so the steady step is the new
    # stages' (before, a run whose trial dropped sampling was predicted as sampled).
    from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
    from lightning_fullgraph.planner.tracker import PredictionTracker

    from .conftest import partitions
    _, parts = partitions(1)
    engine = FullGraphEngine(parts[0], exchange=ExchangeConfig(codec="int2"))
    tracker = PredictionTracker.start(engine)

    class Recorder:  # hands out the calls of the stages running
        recording = False

        def begin(self):
            self.recording = True

        def end(self):
            self.recording = False
            return ("codec", ) if engine.exchange.policy.stages() else ("exact", )

        def remove(self):
            pass
    tracker.recorder.remove()
    tracker.recorder = Recorder()

    def steps(n):
        for _ in range(n):
            tracker.step_start("train")
            tracker.step_end("train")
    steps(3)
    assert tracker.steady["train"] and tracker.profile.train_steady == ("codec", )
    engine.run_stages(())  # e.g. step aside decided the exact exchange
    steps(1)  # recorded: the new stages' first step
    assert not tracker.steady["train"] and not tracker.steady["eval"]
    assert tracker.profile.train_steady == ("exact", )
    steps(1)  # the same calls again: steady
    assert tracker.steady["train"] and tracker.profile.train_steady == ("exact", )
    steps(2)  # nothing changes: nothing recorded
    assert tracker.profile.train == (("codec", ), ("exact", ))
    tracker.close()


def test_exchange_span_is_last_arrival_to_last_departure():
    from lightning_fullgraph.planner.tracker import exchange_span
    # Rank 1 arrives last (at 100.4) and leaves at 102.74; rank 0, with more to move, leaves
    # at 102.8: the group was in the exchange 2.4 s, not rank 1's 2.34 s.
    assert exchange_span(100.4, 102.8, longest=2.8, shortest=2.34) == pytest.approx(2.4)
    # Clocks that disagree move it no further than the ranks' own times.
    assert exchange_span(100.4, 100.5, longest=2.8, shortest=2.34) == 2.34
    assert exchange_span(100.4, 109.0, longest=2.8, shortest=2.34) == 2.8


def test_tracker_fits_the_span_of_synchronous_exchanges():
    # The link fitted to a run: a point whose exchanges were all synchronous is timed from the
    # last rank's arrival to the last one's departure (the step waits for the rank that leaves
    # last); one with more exchanges than marks scales the last arrival's time by the marked
    # ones' ratio; an overlapped one keeps the last arrival's time.
    from dataclasses import replace

    from lightning_fullgraph.engine import FullGraphEngine
    import torch

    from lightning_fullgraph.engine.stats import MARKS, CommStats
    from lightning_fullgraph.planner import LinkModel
    from lightning_fullgraph.planner.tracker import PredictionTracker

    from .conftest import partitions
    _, parts = partitions(1)
    tracker = PredictionTracker.start(FullGraphEngine(parts[0]),
                                      link=LinkModel(alpha=1e-4, beta=1e8))
    tracker.counts = replace(tracker.counts, world_size=2)
    tracker._epoch_points = [("async", "forward"), ("many", "forward"), ("sync", "forward")]
    tracker.offset["train"] = 1  # a steady epoch
    tracker.steady = {"train": True, "eval": True}
    ranks = [CommStats(), CommStats()]
    # (start, seconds) of rank 0 and rank 1 per exchange: rank 1 arrives last, rank 0 leaves
    # last.
    timing = [(100.0, 2.8), (100.4, 2.34)]
    for stats, (start, seconds) in zip(ranks, timing):
        for i in range(2):
            stats.record("sync", "forward", bytes_sent=1000, bytes_received=500, rows_sent=1,
                         rows_received=1, seconds=seconds, started=start + 10 * i)
        for i in range(MARKS + 8):
            stats.record("many", "forward", bytes_sent=10, bytes_received=10, rows_sent=1,
                         rows_received=1, seconds=seconds, started=start + 10 * i)
        stats.record("async", "forward", bytes_sent=10, bytes_received=10, rows_sent=1,
                     rows_received=1, seconds=0.0, started=None)
        stats.add_seconds("async", "forward", seconds)
    assert len(ranks[0].counters[("many", "forward")].marks) == MARKS
    reduced = torch.maximum(*[tracker.observation_vector(s) for s in ranks])
    tracker.observe(reduced)
    observed = {nbytes: (calls, seconds) for calls, nbytes, seconds in tracker.observed}
    assert observed[2000] == (2, pytest.approx(2 * 2.4))  # spans, not 2 x 2.34
    assert observed[400][0] == MARKS + 8
    assert observed[400][1] == pytest.approx((MARKS + 8) * 2.34 * 2.4 / 2.34)
    tracker.observed.clear()
    tracker._epoch_points = [("async", "forward")]
    tracker.observe(torch.maximum(*[tracker.observation_vector(s) for s in ranks]))
    assert list(tracker.observed) == [(1, 10, pytest.approx(2.34))]
    tracker.close()
