"""The step counter codecs see: advanced per training step, settable for resume."""
import torch
from torch_geometric.nn import GCNConv

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine
from lightning_fullgraph.partition import build_local_partitions

from .models import skewed_graph


def test_backward_advances_the_step_and_set_step_sets_every_exchange():
    data = skewed_graph()
    part = build_local_partitions(data, torch.zeros(data.num_nodes, dtype=torch.long))[0]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="hybrid"))
    model = GCNConv(data.num_features, 4)
    engine.attach(model)
    try:  # detached in the end: an attached model keeps PyG's gcn_norm patched for others
        local = engine.data
        assert engine.exchange.step == 0
        for expected in (1, 2):
            engine.backward(model(local.x, local.edge_index).sum())
            assert {ex.step for ex in engine.exchanges.values()} == {expected}
        engine.set_step(41)
        assert {ex.step for ex in engine.exchanges.values()} == {41}
        assert engine.next_step() == 42
    finally:
        engine.detach()
