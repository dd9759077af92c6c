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
    with pytest.raises(ValueError, match="cannot be combined"):
        ExchangePolicy(pipeline="async", cache=0.1)
    with pytest.raises(ValueError, match="cannot be combined"):
        ExchangePolicy(cache=0.1).with_pipeline("async")


def _value(step, ids):
    r"""Row of node ``ids`` at ``step``: tells both the node and the step apart."""
    return ids.double()[:, None] * 1000 + step + torch.arange(F, dtype=torch.float64) / 10


def _grad(step, n):
    return torch.full((n, F), float(step + 1), dtype=torch.float64)


def _stale_steps(rank, world_size, schedule):
    data = skewed_graph(num_nodes=100, num_features=F)
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    pipeline = AsyncPipeline("async", max_async_epochs=3)
    engine = FullGraphEngine(part,
                             exchange=ExchangeConfig(pipeline=pipeline, aggregation="post",
                                                     step_aside=False))
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
def test_async_steps_use_exactly_the_previous_steps_rows_and_gradients():
    schedule = ["async"] * 6 + ["sync", "async", "async"]
    # The reference with injected staleness: step 0 synchronous (nothing older); then one
    # step stale; after 3 asynchronous exchanges one synchronous (max_async_epochs=3); a
    # synchronous step by mode at 6; the chain restarts from the fresh rows.
    fresh = {0, 4, 6}
    expected = []
    for t in range(len(schedule)):
        expected.append(t if t in fresh else t - 1)
    for rank, (rows, grads) in enumerate(run_distributed(_stale_steps, 3, schedule)):
        assert [r for r in rows] == [[e] for e in expected], (rank, rows)
        assert grads == rows, (rank, grads, rows)  # gradients are as stale as the rows
