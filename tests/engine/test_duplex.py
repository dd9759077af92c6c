"""``ExchangeConfig(duplex=True)``: every exchange's two directions at once on two gloo groups.
The same bytes land in the same places as in one all-to-all, so training is bit for bit what
it is without it, in every exchange path (post rows with overlap, hybrid's rows and partials
in one buffer, a lossy codec's byte wire, the pipeline's background transfers)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import Net, skewed_graph

CONFIGS = {
    "post": dict(aggregation="post"),
    "hybrid": dict(aggregation="hybrid"),
    "int2-hybrid": dict(aggregation="hybrid", codec="int2"),
    "pipeline": dict(aggregation="post", pipeline="async"),
}


def _train(part, num_features, kind, config, duplex, steps=3):
    engine = FullGraphEngine(part, exchange=ExchangeConfig(step_aside=False, duplex=duplex,
                                                           **config))
    torch.manual_seed(1)
    model = Net(kind, num_features, 4)
    engine.attach(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    local = engine.data
    outs = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(local.x, local.edge_index)
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        opt.step()
        outs.append(out.detach().clone())
    grads = [p.grad.clone() for p in model.parameters()]
    params = [p.detach().clone() for p in model.parameters()]
    split = engine.transport.duplex_group is not None
    engine.detach()
    engine.transport.close()
    return outs, grads, params, split


def _compare(rank, world_size):
    torch.manual_seed(0)
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    result = {}
    for name, config in CONFIGS.items():
        for kind in ("sage_mean", "gcn"):
            plain = _train(part, data.num_features, kind, config, duplex=False)
            both = _train(part, data.num_features, kind, config, duplex=True)
            result[(name, kind)] = dict(
                split=(plain[3], both[3]),
                equal=[all(torch.equal(a, b) for a, b in zip(x, y))
                       for x, y in zip(plain[:3], both[:3])])
    return result


@pytest.mark.multiprocess
def test_duplex_training_is_bit_for_bit_the_same():
    results = run_distributed(_compare, 3, timeout_s=240)
    for rank, result in enumerate(results):
        assert set(result) == {(n, k) for n in CONFIGS for k in ("sage_mean", "gcn")}
        for where, r in result.items():
            assert r["split"] == (False, True), (rank, where)
            assert r["equal"] == [True, True, True], (rank, where, "outputs, grads, params")


def test_duplex_is_a_bool_and_is_described():
    assert ExchangeConfig().duplex is False
    assert ExchangeConfig(duplex=True).describe().endswith("duplex")
    with pytest.raises(TypeError, match="duplex"):
        ExchangeConfig(duplex="yes")
