"""Boundary node sampling (BNS-GCN): a fraction p of halo nodes, scaled by 1/p, unbiased."""
import math

import numpy as np
import pytest
import torch

from lightning_fullgraph.engine import (AsyncPipeline, BoundarySampling, ExchangePolicy,
                                        FullGraphEngine)
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import layer_exchange, skewed_graph
from lightning_fullgraph.engine import ExchangeConfig

F = 5


def test_settings_and_draws():
    with pytest.raises(ValueError, match="rate"):
        BoundarySampling(0.0)
    with pytest.raises(ValueError, match="rate"):
        BoundarySampling(1.5)
    assert BoundarySampling.of(None) is None and BoundarySampling.of(0.3).rate == 0.3
    assert BoundarySampling(1.0).lossless and not ExchangePolicy(sampling=0.5).lossless
    assert "boundary sampling p=0.5" in ExchangePolicy(sampling=0.5).describe()
    assert "async pipeline" in ExchangePolicy(sampling=0.5, pipeline="async").describe()
    assert "adaptive cache" in ExchangePolicy(sampling=0.5, cache=0.1).describe()
    s = BoundarySampling(0.3)
    assert s.pre and not BoundarySampling(0.3, pre=False).pre
    assert "source rows only" in ExchangePolicy(sampling=BoundarySampling(0.5, False)).describe()
    ids = torch.arange(20000)
    kept = s.kept(ids, receiver=1, seed=0, step=4)
    assert abs(kept.float().mean().item() - 0.3) < 0.02
    assert torch.equal(kept, s.kept(ids, 1, 0, 4))            # a pure function
    assert not torch.equal(kept, s.kept(ids, 2, 0, 4))        # each receiver draws its own
    assert not torch.equal(kept, s.kept(ids, 1, 0, 5))        # and anew every step
    slots = s.kept_slots(ids[:30], [10, 0, 20], seed=0, step=4)
    assert torch.equal(slots[:10], s.kept(ids[:10], 0, 0, 4))
    assert torch.equal(slots[10:], s.kept(ids[10:30], 2, 0, 4))
    # Partial aggregates: what rank 1 sends to rank 2 is what rank 2 receives from rank 1.
    sent = s.kept_partials(ids[:30], [10, 0, 20], rank=1, sending=True, seed=0, step=4)
    got = s.kept_partials(ids[10:30], [0, 20, 0], rank=2, sending=False, seed=0, step=4)
    assert torch.equal(sent[10:], got)
    back = s.kept_partials(ids[10:30], [0, 20, 0], rank=2, sending=True, seed=0, step=4)
    assert not torch.equal(back, got)  # the other direction of a pair draws its own


def _monte_carlo(rank, world_size, rate, steps):
    data = skewed_graph(num_nodes=90, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(sampling=rate, aggregation="post",
                                                     step_aside=False))
    ex = engine.exchange
    x = data.x[part.owned_ids].double()
    total = torch.zeros(ex.num_halo, F, dtype=torch.float64)
    grads_ok = True
    for step in range(steps):
        ex.step = step
        xs = x.clone().requires_grad_()
        out = layer_exchange(ex, xs)
        halo = out[ex.num_owned:]
        total += halo.detach()
        # Only kept rows arrive (scaled by 1/p), the others are zero.
        kept = (halo.detach().abs().sum(1) > 0)
        expected = ex._sampled()[1] & (x.abs().sum(1).new_ones(ex.num_halo) > 0)
        grads_ok &= bool(torch.equal(kept, expected))
        # Backward: d(sum of halo)/dx = (number of kept slots of the row) / p.
        halo.sum().backward()
        send_kept = ex._sampled()[0]
        count = torch.zeros(ex.num_owned, dtype=torch.float64)
        count.index_add_(0, ex.plan.post.send_index[send_kept],
                         torch.ones(int(send_kept.sum()), dtype=torch.float64))
        grads_ok &= bool(torch.allclose(xs.grad, (count / rate)[:, None].expand_as(xs)))
    truth = data.x[part.halo_ids].double()
    mean = total / steps
    # The mean of a kept-with-probability-p, 1/p-scaled row is the row; its standard error
    # is |x| sqrt((1 - p) / (p T)).
    sigma = truth.abs() * math.sqrt((1 - rate) / (rate * steps))
    within = bool(((mean - truth).abs() <= 4 * sigma + 1e-12).all())
    with torch.no_grad():
        fresh = layer_exchange(ex, x)[ex.num_owned:]
    stats = ex.stats.total()
    return dict(within=within, grads_ok=grads_ok, fresh=bool(torch.equal(fresh, truth)),
                kept_fraction=1 - stats.rows_skipped / max(1, stats.rows_eligible))


@pytest.mark.multiprocess
def test_sampled_halo_rows_are_unbiased_and_gradients_follow():
    for rank, r in enumerate(run_distributed(_monte_carlo, 3, 0.3, 400)):
        assert r["within"] and r["grads_ok"] and r["fresh"], (rank, r)
        assert abs(r["kept_fraction"] - 0.3) < 0.05, r


def _layer_reduce(exchange, aggregated, training=True):
    # exchange.reduce(...) as a partitioned layer in training mode calls it.
    from lightning_fullgraph.engine.context import ActiveLayer, pop_layer, push_layer
    push_layer(ActiveLayer("probe", exchange, training=training))
    try:
        return exchange.reduce(aggregated, key="probe.pre")
    finally:
        pop_layer()


def _partials(rank, world_size, sampling, steps):
    # Pre-aggregation: every cut edge crosses inside a partial aggregate (one row per
    # destination and sending rank).  Rows with a value per (sender, destination) and step.
    data = skewed_graph(num_nodes=90, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(sampling=sampling, aggregation="pre",
                                                     step_aside=False))
    ex = engine.exchanges["pre"]
    n, slots = ex.num_owned, ex.num_pre_slots
    g = torch.Generator().manual_seed(rank)
    aggregated = torch.randn(n + slots, F, generator=g, dtype=torch.float64) + 2.0
    with torch.no_grad():
        exact = _layer_reduce(ex, aggregated)  # evaluation: every partial aggregate, exact
        # Per owned row, the sum of its received partial rows squared (for the variance).
        squares = _layer_reduce(ex, aggregated ** 2) - aggregated[:n] ** 2
    total = torch.zeros_like(exact)
    grads_ok, rate = True, getattr(sampling, "rate", sampling)
    rows = []
    for step in range(steps):
        ex.step = step
        a = aggregated.clone().requires_grad_()
        out = _layer_reduce(ex, a)
        total += out.detach()
        out.sum().backward()
        sent = ex._sampled_pre()
        # d(sum)/d(slot) is 1/p for the slots this step keeps and 0 for the others.
        expect = torch.ones_like(a)
        if sent is not None:
            expect[n:] = (sent[0].double() / rate)[:, None]
        grads_ok &= bool(torch.equal(a.grad, expect))
        rows.append(None if sent is None else int(sent[0].sum()))
    stats = ex.stats.total()
    # A kept-with-probability-p, 1/p-scaled row x has variance x^2 (1 - p) / p.
    sd = (squares.clamp_min(0) * (1 - rate) / (rate * steps)).sqrt() if rate else squares
    return dict(mean=(total / steps).numpy(), exact=exact.numpy(), sd=sd.numpy(),
                grads_ok=grads_ok, slots=slots, kept=rows, eligible=stats.rows_eligible,
                skipped=stats.rows_skipped, bytes=stats.bytes_sent)


@pytest.mark.multiprocess
def test_partial_aggregates_are_sampled_unbiased_and_their_gradients_follow():
    rate, steps = 0.3, 300
    results = run_distributed(_partials, 3, rate, steps)
    assert sum(r["slots"] for r in results) > 0
    for rank, r in enumerate(results):
        assert r["grads_ok"], rank
        # Each owned row gets a sum of partial rows, each kept with p and scaled by 1/p: the
        # mean over steps is the exact sum within a few standard errors (rows that receive
        # nothing are exact).
        err = abs(r["mean"] - r["exact"])
        assert (err <= 4.5 * r["sd"] + 1e-12).all(), (rank, (err / r["sd"]).max())
        if r["slots"]:
            kept = sum(r["kept"]) / (r["slots"] * steps)
            assert abs(kept - rate) < 0.05, (rank, kept)
            assert r["skipped"] > 0
    # Fewer bytes than exact pre-aggregation, and pre=False sends every partial aggregate.
    exact_bytes = run_distributed(_partials, 3, None, 3)
    posts_only = run_distributed(_partials, 3, BoundarySampling(rate, pre=False), 3)
    for rank, (e, q) in enumerate(zip(exact_bytes, posts_only)):
        assert q["bytes"] == e["bytes"] and q["grads_ok"], rank
        assert (q["mean"] == e["mean"]).all(), rank  # bit for bit: nothing sampled
    assert sum(r["bytes"] for r in results) / steps < 0.6 * sum(e["bytes"] / 3
                                                               for e in exact_bytes)


def _train(rank, world_size, sampling, cache=None, kind="gcn"):
    from .models import Net
    data = skewed_graph(num_nodes=150, num_features=8)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    torch.manual_seed(0)
    model = Net(kind, 8, 4)
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(sampling=sampling, cache=cache,
                                                     aggregation="hybrid", step_aside=False))
    engine.attach(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    outs = []
    try:
        for _ in range(5):
            engine.next_step()
            opt.zero_grad()
            out = model(engine.data.x, engine.data.edge_index)
            mask = engine.data.train_mask
            loss = torch.nn.functional.cross_entropy(out[mask], engine.data.y[mask])
            engine.backward(engine.scale_loss(loss))
            opt.step()
            outs.append(out.detach().numpy())
        grads = [p.grad.numpy().copy() for p in model.parameters()]
        total = engine.stats.total()
    finally:
        engine.detach()
    return outs, grads, total.bytes_sent, total.rows_skipped, total.rows_eligible


@pytest.mark.multiprocess
def test_rate_one_is_bit_identical_to_no_sampling():
    for a, b in zip(run_distributed(_train, 2, None), run_distributed(_train, 2, 1.0)):
        assert all((x == y).all() for x, y in zip(a[0], b[0]))


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["gcn", "sage_mean"])
def test_cache_with_epsilon_zero_under_sampling_is_sampling_alone(kind):
    # The cache picks among each step's kept rows: with epsilon 0 it skips only rows that did
    # not change (the raw features of layer 1), so logits and gradients are those of
    # sampling alone, bit for bit, with fewer bytes.
    from lightning_fullgraph.engine import HaloCache
    alone = run_distributed(_train, 3, 0.5, None, kind)
    both = run_distributed(_train, 3, 0.5, HaloCache(0.0), kind)
    for rank, (a, b) in enumerate(zip(alone, both)):
        assert all((x == y).all() for x, y in zip(a[0], b[0])), rank
        assert all((x == y).all() for x, y in zip(a[1], b[1])), rank
        assert b[3] > a[3], (rank, a[3], b[3])  # the cache skipped more rows
    assert sum(b[2] for b in both) < sum(a[2] for a in alone)


def _first_kept(rank, world_size):
    from lightning_fullgraph.engine import HaloCache
    data = skewed_graph(num_nodes=120, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    # epsilon 10: no row that arrived once is ever resent (the features do not change).
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(cache=HaloCache(10.0, max_age=1000),
                                                     sampling=0.5, aggregation="post",
                                                     step_aside=False))
    ex = engine.exchange
    x = data.x[part.owned_ids]
    truth = data.x[part.halo_ids]
    ok = []
    for step in range(4):
        ex.step = step
        halo = layer_exchange(ex, x)[ex.num_owned:]
        kept = ex._sampled()[1]
        ok.append(torch.allclose(halo[kept], truth[kept] / 0.5)
                  and bool((halo[~kept] == 0).all()))
    return ok


@pytest.mark.multiprocess
def test_a_kept_row_the_receiver_never_got_is_sent_whatever_epsilon():
    for rank, ok in enumerate(run_distributed(_first_kept, 3)):
        assert all(ok), (rank, ok)


def _pipelined_sampling(rank, world_size, steps):
    # The same sampled exchanges with and without the asynchronous pipeline (post rows and
    # pre partials, forward and backward): with it, step t hands out exactly what step t - 1
    # received without it (that step's sample, placed by that step's draws); step 0 is
    # synchronous.
    data = skewed_graph(num_nodes=90, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    out = {}
    for pipelined in (False, True):
        pipeline = AsyncPipeline("async", max_async_epochs=0) if pipelined else None
        engine = FullGraphEngine(part, exchange=ExchangeConfig(
            sampling=0.5, aggregation="pre", pipeline=pipeline, step_aside=False))
        post, pre = engine.exchanges["post"], engine.exchanges["pre"]
        n, slots = pre.num_owned, pre.num_pre_slots
        runs = []
        for step in range(steps):
            post.step = pre.step = step
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(n, F, generator=g, dtype=torch.float64).requires_grad_()
            halo = layer_exchange(post, x)[n:]
            halo.backward(torch.randn(halo.shape, generator=g, dtype=torch.float64))
            a = torch.randn(n + slots, F, generator=g, dtype=torch.float64).requires_grad_()
            reduced = _layer_reduce(pre, a)
            reduced.backward(torch.randn(reduced.shape, generator=g, dtype=torch.float64))
            runs.append({k: v.detach().numpy().copy() for k, v in dict(
                halo=halo, x_grad=x.grad, reduced=reduced, owned=a[:n], a_grad=a.grad).items()})
        post.drain()
        pre.drain()
        out[pipelined] = runs
    return out


@pytest.mark.multiprocess
def test_sampling_through_the_pipeline_hands_out_the_previous_steps_sample():
    steps = 5
    for rank, r in enumerate(run_distributed(_pipelined_sampling, 3, steps)):
        sync, piped = r[False], r[True]
        for step in range(steps):
            now, before = sync[step], sync[max(step - 1, 0)]
            mine = piped[step]
            # Post rows: the halo rows the previous step's sample carried; gradients back
            # to their owners: those of the previous step's sample.
            assert np.array_equal(mine["halo"], before["halo"]), (rank, step)
            assert np.array_equal(mine["x_grad"], before["x_grad"]), (rank, step)
            # Pre partials: the previous step's, added into this step's owned rows; the
            # slots' gradients: the previous step's.
            assert np.allclose(mine["reduced"] - mine["owned"],
                                  before["reduced"] - before["owned"], rtol=0, atol=1e-12)
            assert np.array_equal(mine["a_grad"][:now["owned"].shape[0]],
                               now["a_grad"][:now["owned"].shape[0]])
            assert np.array_equal(mine["a_grad"][now["owned"].shape[0]:],
                               before["a_grad"][now["owned"].shape[0]:]), (rank, step)
        # Something was sampled away, and the steps differ (the test can fail).
        assert not np.array_equal(sync[1]["halo"], sync[2]["halo"])
