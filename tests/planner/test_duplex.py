"""The planner prices ``ExchangeConfig(duplex=True)``: a link carries the gain of sending both
directions at once (measured on the group: :func:`calibrate_duplex`), and a tracker predicts
the exchanges of a duplex transport at it, while the transport splits them."""
import math

import pytest

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.planner import LinkModel, calibrate, fit_link, profile_model
from lightning_fullgraph.planner.calibrate import calibrate_duplex
from lightning_fullgraph.planner.tracker import PredictionTracker
from lightning_fullgraph.testing import run_distributed

from .conftest import build, partitions


def test_duplex_gain_scales_the_bandwidth_of_a_duplex_link():
    link = LinkModel(alpha=1e-4, beta=1e8, world_size=4, duplex_gain=1.6)
    both = link.duplexed()
    assert both.beta == pytest.approx(1.6e8) and both.alpha == link.alpha
    assert both.duplex_gain == 1.0  # applied once
    assert both.exchange_seconds(1e8, 4) == pytest.approx(3e-4 + 1 / 1.6)
    assert LinkModel.from_dict(link.to_dict()) == link
    assert "both directions at once 1.60x faster" in link.describe()
    assert LinkModel(alpha=1e-4, beta=1e8).duplex_gain == 1.0  # not measured: no gain
    assert "both directions" not in LinkModel(alpha=1e-4, beta=1e8).describe()
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="duplex_gain"):
            LinkModel(alpha=1e-4, beta=1e8, duplex_gain=bad)
    # A link fitted to a run's exchanges keeps its prior's gain, as it keeps its queue wait.
    fitted = fit_link([(10, 10 * 4_000_000, 0.5)], 4, prior=link)
    assert fitted.duplex_gain == 1.6


def test_a_duplex_run_is_observed_back_in_one_collectives_time():
    link = LinkModel(alpha=1e-4, beta=1e8, world_size=4, duplex_gain=1.6)
    both = link.duplexed()
    # The inverse of duplexed(): ten exchanges of 4 MB each, as a duplex transport takes them.
    observed = 10 * both.exchange_seconds(4e6, 4)
    assert link.one_collective_seconds(observed, 10, 4) == pytest.approx(
        10 * link.exchange_seconds(4e6, 4))
    # The latency is not gained back: exchanges of no bytes take as long either way, and
    # ones faster than the latency alone are left as they are.
    assert link.one_collective_seconds(10 * 3e-4, 10, 4) == pytest.approx(10 * 3e-4)
    assert link.one_collective_seconds(1e-4, 10, 4) == pytest.approx(1e-4)
    assert LinkModel(alpha=1e-4, beta=1e8).one_collective_seconds(0.5, 10, 4) == 0.5
    # Fitted to the observations so restored, the link is the one they were priced on.
    rows = [(10, 10 * n, link.one_collective_seconds(10 * both.exchange_seconds(n, 4), 10, 4))
            for n in (1e5, 1e6, 4e6, 16e6)]
    fitted = fit_link(rows, 4, prior=link)
    assert fitted.alpha == pytest.approx(link.alpha, rel=1e-3)
    assert fitted.beta == pytest.approx(link.beta, rel=1e-3)


def test_one_process_gains_nothing():
    assert calibrate_duplex() == 1.0
    assert calibrate(sizes=(0, 1 << 10), repeats=1, warmup=0, codec_rows=8,
                     duplex=True).duplex_gain == 1.0


def _rank(rank, world_size, profile):
    import torch.distributed as dist
    from torch_geometric.nn.models import GraphSAGE
    direct = calibrate_duplex(nbytes=1 << 20, repeats=2)
    asked = calibrate(sizes=(0, 1 << 16, 1 << 20), repeats=2, warmup=0, codec_rows=8,
                      bulk_repeats=1, duplex=True).duplex_gain
    unasked = calibrate(sizes=(0, 1 << 16), repeats=2, warmup=0, codec_rows=8).duplex_gain
    # A tracker given a link without the gain, for an engine with a duplex group, measures it
    # on the engine's group (a subgroup here: its ranks alone) and predicts at it while the
    # transport splits, at one collective when it does not.
    sub = dist.new_group(ranks=[0, 1], use_local_synchronization=True)
    out = dict(direct=direct, asked=asked, unasked=unasked)
    if rank < 2:
        data, parts = partitions(2)
        engine = FullGraphEngine(parts[rank], group=sub,
                                 exchange=ExchangeConfig(aggregation="post", duplex=True,
                                                         step_aside=False))
        model = GraphSAGE(data.num_features, 16, 2, 4)
        engine.attach(model)
        link = LinkModel(alpha=1e-4, beta=1e6, world_size=2, backend="gloo")
        tracker = PredictionTracker.start(engine, profile, link)
        gain = tracker.link.duplex_gain
        split = tracker.step_seconds().view(-1, 4)[:, 0].tolist()
        engine.transport.duplex = False
        one = tracker.step_seconds().view(-1, 4)[:, 0].tolist()
        # The same predictions from the links themselves.
        tracker.link, measured = tracker.link.duplexed(), tracker.link
        by_hand = tracker.step_seconds().view(-1, 4)[:, 0].tolist()
        tracker.link = measured
        # An engine without duplex: the file's link is used as it is (nothing measured).
        plain = FullGraphEngine(parts[rank], group=sub,
                                exchange=ExchangeConfig(aggregation="post", step_aside=False))
        plain.attach(GraphSAGE(data.num_features, 16, 2, 4))
        untouched = PredictionTracker.start(plain, profile, link).link.duplex_gain
        out.update(gain=gain, split=split, one=one, by_hand=by_hand, untouched=untouched)
        for e in (engine, plain):
            e.detach()
            e.transport.close()
    dist.barrier()
    return out


@pytest.mark.multiprocess
def test_the_gain_is_measured_alike_and_priced_while_the_transport_splits():
    data, _ = partitions(2)
    profile = profile_model(build("sage", data.num_features), data.num_features,
                            aggregation="post")
    results = run_distributed(_rank, 3, profile, timeout_s=180)
    for key in ("direct", "asked", "unasked"):
        assert len({r[key] for r in results}) == 1, key  # the same on every rank
    assert results[0]["direct"] > 0 and results[0]["asked"] > 0
    assert results[0]["unasked"] == 1.0  # measured only when asked
    a, b = results[0], results[1]
    assert a["gain"] == b["gain"] > 0 and a["untouched"] == 1.0 and "gain" not in results[2]
    for r in (a, b):
        assert r["split"] == pytest.approx(r["by_hand"])
        # At one collective the bytes take gain times longer (the latency the same).
        bytes_split = [s - 1e-4 for s in r["split"]]
        bytes_one = [s - 1e-4 for s in r["one"]]
        assert bytes_one == pytest.approx([s * r["gain"] for s in bytes_split])
