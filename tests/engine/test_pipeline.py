"""The asynchronous halo pipeline (PipeGCN): one-step-stale rows and gradients, bounded runs."""
import pytest
import torch

from lightning_fullgraph.engine import AsyncPipeline, ExchangePolicy, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import layer_exchange, skewed_graph
from lightning_fullgraph.engine import ExchangeConfig

F = 6


def test_settings_are_validated_and_parsed():
    assert AsyncPipeline.of(None) is None and AsyncPipeline.of("sync") is None
    assert AsyncPipeline.of("async").mode == "async"
    assert AsyncPipeline.of("adaptive").mode == "sync"  # the adaptor starts synchronous
    with pytest.raises(ValueError, match="mode"):
        AsyncPipeline("sometimes")
    with pytest.raises(ValueError, match="max_async_epochs"):
        AsyncPipeline(max_async_epochs=-1)
    with pytest.raises(ValueError, match="unknown pipeline"):
        AsyncPipeline.of("later")
    policy = ExchangePolicy(pipeline="async")
    assert not policy.lossless and "async pipeline" in policy.describe()
    # A cache composes with the pipeline (the pipeline carries the cache's rows); the three
    # stages together are refused with the reason.
    assert ExchangePolicy(pipeline="async", cache=0.1).stages() == ("cache", "pipeline")
    with pytest.raises(ValueError, match="cannot be combined yet .*choose two"):
        ExchangePolicy(pipeline="async", cache=0.1, sampling=0.5)
    with pytest.raises(ValueError, match="cannot be combined"):
        ExchangePolicy(cache=0.1, sampling=0.5).with_pipeline("async")


def _value(step, ids):
    r"""Row of node ``ids`` at ``step``: tells both the node and the step apart."""
    return ids.double()[:, None] * 1000 + step + torch.arange(F, dtype=torch.float64) / 10


def _grad(step, n):
    return torch.full((n, F), float(step + 1), dtype=torch.float64)


def _stale_steps(rank, world_size, schedule, cache=None):
    data = skewed_graph(num_nodes=100, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    pipeline = AsyncPipeline("async", max_async_epochs=3)
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(pipeline=pipeline, aggregation="post",
                                                     cache=cache, step_aside=False))
    ex = engine.exchange
    n_own = ex.num_owned
    rows, grads = [], []
    for step, mode in enumerate(schedule):
        pipeline.mode = mode
        ex.step = step
        x = _value(step, part.owned_ids).requires_grad_()
        out = layer_exchange(ex, x)
        halo = out[n_own:].detach()
        # Which step's rows arrived: every halo row carries its step in the fraction.
        seen = sorted({int(v) for v in (halo[:, 0] - part.halo_ids.double() * 1000).round()})
        rows.append(seen)
        # Backward: halo gradients tagged with the step; the owner adds what arrived.
        grad_out = torch.zeros_like(out)
        grad_out[n_own:] = _grad(step, ex.num_halo)
        out.backward(grad_out)
        # A row sent to k peers gets k gradients: divide by k to read the step tag.
        sent = ex.plan.post.send_index
        mult = torch.bincount(sent, minlength=n_own).double()
        rows_sent = sent.unique()
        tags = x.grad[rows_sent][:, 0] / mult[rows_sent]
        grads.append(sorted({int(round(float(v))) - 1 for v in tags}))
        with torch.no_grad():  # evaluation in between: fresh rows, the pipeline untouched
            fresh = ex.extend(_value(100 + step, part.owned_ids), key="probe")[n_own:]
        assert torch.equal(fresh, _value(100 + step, part.halo_ids))
    engine.drain()
    return rows, grads


@pytest.mark.multiprocess
@pytest.mark.parametrize("cache", [None, 0.0])
def test_async_steps_use_exactly_the_previous_steps_rows_and_gradients(cache):
    # With a cache of threshold 0 (every changed row goes) the pipeline carries the cache's
    # rows: the same staleness, step for step, as without it.
    schedule = ["async"] * 6 + ["sync", "async", "async"]
    # The reference with injected staleness: step 0 synchronous (nothing older); then one
    # step stale; after 3 asynchronous exchanges one synchronous (max_async_epochs=3); a
    # synchronous step by mode at 6; the chain restarts from the fresh rows.
    fresh = {0, 4, 6}
    expected = []
    for t in range(len(schedule)):
        expected.append(t if t in fresh else t - 1)
    for rank, (rows, grads) in enumerate(run_distributed(_stale_steps, 3, schedule, cache)):
        assert [r for r in rows] == [[e] for e in expected], (rank, rows)
        assert grads == rows, (rank, grads, rows)  # gradients are as stale as the rows


def _cached_pipeline_converges(rank, world_size, steps):
    from lightning_fullgraph.engine import HaloCache
    data = skewed_graph(num_nodes=100, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    pipeline = AsyncPipeline("async", max_async_epochs=0)  # never a synchronous step
    engine = FullGraphEngine(part, exchange=ExchangeConfig(
        pipeline=pipeline, cache=HaloCache(0.05, max_age=3), aggregation="post",
        step_aside=False))
    ex = engine.exchange
    halo = []
    for step in range(steps):
        ex.step = step
        # Rows move for three steps (some by less than the threshold), then stay.
        moved = min(step, 3) * (0.01 + (part.owned_ids % 7 == 0).double()[:, None])
        x = _value(0, part.owned_ids) * (1 + moved)
        halo.append(layer_exchange(ex, x)[ex.num_owned:].detach())
    engine.drain()
    moved = 3 * (0.01 + (part.halo_ids % 7 == 0).double()[:, None])
    truth = _value(0, part.halo_ids) * (1 + moved)
    return [float((h - truth).abs().max()) for h in halo]


@pytest.mark.multiprocess
def test_a_cache_carried_by_the_pipeline_keeps_both_ends_alike():
    # The sender's mirror moves when it sends, the receiver's copy a step later: if the two
    # disagreed, a row the sender believes delivered would stay wrong for good.  Once the
    # rows stop moving, every row arrives within max_age + 1 steps, exactly.
    for rank, errors in enumerate(run_distributed(_cached_pipeline_converges, 3, 10)):
        assert max(errors[1:4]) > 0, (rank, errors)  # stale (and cached) while rows move
        assert errors[-1] == 0.0 and errors[-2] == 0.0, (rank, errors)


def _collective_behind_transfer(rank, world_size):
    import torch.distributed as dist
    from datetime import timedelta
    data = skewed_graph(num_nodes=100, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    # A short timeout: were the all-reduce below queued behind the transfer, the ranks would
    # wait for each other until it expires (a deadlock), and the test fail.
    group = dist.new_group(timeout=timedelta(seconds=20))
    engine = FullGraphEngine(part, group, exchange=ExchangeConfig(
        pipeline="async", aggregation="post", step_aside=False))
    ex = engine.exchange
    total = torch.ones(1)
    for step in range(3):
        ex.step = step
        # From step 1 (asynchronous; step 0 is synchronous: nothing older) rank 1 reduces
        # before it starts its transfer, rank 0 after, while its transfer is in flight
        # waiting for rank 1's.
        first = rank == 1 and step > 0
        if first:
            dist.all_reduce(total, group=group)
        layer_exchange(ex, _value(step, part.owned_ids))
        if not first:
            dist.all_reduce(total, group=group)
    engine.drain()
    return float(total), engine.transport.background_group is not None


@pytest.mark.multiprocess
def test_a_collective_does_not_wait_for_the_pipelines_transfer_in_flight():
    # The step's gradient all-reduce, evaluation and agreements run on the engine's group
    # while the pipeline's transfer is in flight: the transfer runs on a group of its own.
    for total, background in run_distributed(_collective_behind_transfer, 2, timeout_s=120):
        assert background
        assert total == 2.0 ** 3
