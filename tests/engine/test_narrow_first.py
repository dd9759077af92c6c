"""``SAGEConv``/``GraphConv`` narrower than their input transform first and aggregate after:
the exchanged rows are ``out_channels`` wide, the result is PyG's within reassociation, and
a layer whose aggregated rows something observes keeps PyG's order."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphConv, SAGEConv

from lightning_fullgraph.engine import ExchangeConfig, FullGraphEngine, MODES
from lightning_fullgraph.engine.narrow_first import narrowable
from lightning_fullgraph.partition import build_local_partitions, metis_partition
from lightning_fullgraph.testing import run_distributed

from .models import skewed_graph
from .test_exactness import FP32, _per_tensor, _rel

WIDE, NARROW = 24, 4  # 4 classes


class Net(torch.nn.Module):
    def __init__(self, kind: str, in_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, WIDE)
        self.kind = kind
        if kind == "sage_mean":
            self.conv = SAGEConv(WIDE, NARROW, aggr="mean")
        elif kind == "sage_sum_project_normalize":
            self.conv = SAGEConv(WIDE, NARROW, aggr="sum", project=True, normalize=True)
        else:
            self.conv = GraphConv(WIDE, NARROW, aggr="add")

    def forward(self, x, edge_index, edge_weight):
        h = self.lin(x).relu()
        if self.kind == "graph_weighted":
            return self.conv(h, edge_index, edge_weight)
        return self.conv(h, edge_index)


KINDS = ("sage_mean", "sage_sum_project_normalize", "graph_weighted")


def _run(rank: int, world_size: int, mode: str, observe: bool, kernels: str = None):
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation=mode))
    local = engine.data
    out = {}
    for kind in KINDS:
        torch.manual_seed(1)
        ref = Net(kind, data.num_features)
        model = copy.deepcopy(ref)
        if observe:  # a user's message hook sees the rows aggregated: PyG's order
            seen = []
            model.conv.register_message_forward_hook(lambda m, i, o: seen.append(o.size(-1)))
        engine.attach(model)
        if kernels:
            engine.use_kernels(kernels)
        engine.stats.reset()
        logits_ref = ref(data.x, data.edge_index, data.edge_weight)
        F.cross_entropy(logits_ref[data.train_mask], data.y[data.train_mask]).backward()
        logits = model(local.x, local.edge_index, local.edge_weight)
        engine.backward(F.cross_entropy(logits[local.train_mask], local.y[local.train_mask]))
        widths = {key: c.features_sent // max(c.rows_sent, 1)
                  for key, c in engine.stats.per_key().items() if c.rows_sent}
        out[kind] = dict(logits=_rel(engine.gather(logits), logits_ref.detach()),
                         grads=_per_tensor(model, ref, lambda p: p.grad), widths=widths,
                         seen=sorted(set(seen)) if observe else None)
        engine.detach()
    return out


def test_narrowable_layers():
    assert narrowable(SAGEConv(8, 2)) and narrowable(SAGEConv(8, 2, aggr="sum"))
    assert narrowable(GraphConv(8, 2)) and narrowable(GraphConv(8, 2, aggr="mean"))
    assert not narrowable(SAGEConv(8, 2, aggr="max"))  # not linear
    assert not narrowable(SAGEConv(8, 2, aggr=["mean", "max"]))
    assert not narrowable(SAGEConv(2, 8)) and not narrowable(GraphConv(8, 8))  # not narrower
    assert not narrowable(SAGEConv(-1, 2))  # lazy: its width is not known yet

    class Own(SAGEConv):
        def forward(self, x, edge_index):
            return super().forward(x, edge_index) * 2
    assert not narrowable(Own(8, 2))  # a forward of its own may use the rows otherwise


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode,kernels", [(m, None) for m in MODES] + [("hybrid", "auto")])
def test_narrow_layers_exchange_their_output_width_exactly(mode, kernels):
    for rank, result in enumerate(run_distributed(_run, 3, mode, False, kernels)):
        for kind, r in result.items():
            assert r["logits"] < FP32, (rank, kind, r)
            assert all(v < FP32 for v in r["grads"].values()), (rank, kind, r)
            # Every exchange of the layer (halo rows, pre partials, their gradients) is
            # NARROW wide, not WIDE.
            assert r["widths"] and set(r["widths"].values()) == {NARROW}, (rank, kind, r)


@pytest.mark.multiprocess
def test_an_observed_layer_keeps_pyg_order():
    for rank, result in enumerate(run_distributed(_run, 2, "hybrid", True)):
        for kind, r in result.items():
            assert r["logits"] < FP32 and all(v < FP32 for v in r["grads"].values())
            assert r["seen"] == [WIDE], (rank, kind, r)  # the hook saw the layer's own rows
            assert set(r["widths"].values()) == {WIDE}, (rank, kind, r)


def _raw_features(rank: int, world_size: int, dropout: bool):
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="post"))
    local = engine.data
    torch.manual_seed(1)
    conv = SAGEConv(data.num_features, 4)  # narrower than the features (8)
    engine.attach(conv)
    widths = []
    for step in range(6):
        engine.stats.reset()
        torch.manual_seed(step)
        x = F.dropout(local.x, 0.5) if dropout else local.x
        out = conv(x, local.edge_index)
        engine.backward(F.cross_entropy(out[local.train_mask], local.y[local.train_mask]))
        widths.append(sorted({c.features_sent // c.rows_sent
                              for c in engine.stats.per_key().values() if c.rows_sent}))
    engine.detach()
    return widths


@pytest.mark.multiprocess
def test_raw_features_are_kept_not_narrowed_until_the_cache_gives_up():
    kept, dropped = (run_distributed(_raw_features, 2, d)[0] for d in (False, True))
    assert kept == [[8], [], [], [], [], []]  # exchanged once at full width, then reused
    # Input dropout: a new tensor every step; the cache gives up after its misses and the
    # layer narrows from then on.
    assert dropped[0] == [8] and dropped[-1] == [4], dropped


def _observer_added_later(rank: int, world_size: int, on_ranks: tuple):
    # Two steps narrowed, then a message hook on `on_ranks`: the layer must take PyG's order
    # on every rank (hook on all) or fail on every rank (hook on one), never send rows of two
    # widths.
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="post"))
    local = engine.data
    torch.manual_seed(1)
    ref = Net("sage_mean", data.num_features)
    model = copy.deepcopy(ref)
    engine.attach(model)
    widths, seen = [], []
    for step in range(3):
        if step == 2 and rank in on_ranks:
            model.conv.register_message_forward_hook(lambda m, i, o: seen.append(o.size(-1)))
        engine.stats.reset()
        model(local.x, local.edge_index, local.edge_weight).sum().backward()
        widths.append({c.features_sent // max(c.rows_sent, 1)
                       for key, c in engine.stats.per_key().items()
                       if key.startswith("conv") and c.rows_sent})
    logits = engine.gather(model(local.x, local.edge_index, local.edge_weight))
    return widths, sorted(set(seen)), _rel(logits, ref(data.x, data.edge_index, None).detach())


@pytest.mark.multiprocess
def test_an_observer_added_on_every_rank_is_agreed_again():
    for rank, (widths, seen, err) in enumerate(run_distributed(_observer_added_later, 2,
                                                                (0, 1))):
        assert widths == [{NARROW}, {NARROW}, {WIDE}], (rank, widths)
        assert seen == [WIDE] and err < FP32, (rank, seen, err)


@pytest.mark.multiprocess
def test_an_observer_added_on_one_rank_fails_every_rank_not_silently():
    from lightning_fullgraph.testing import run_outcomes
    outcomes = run_outcomes(_observer_added_later, 2, (0, ), timeout_s=10)
    assert [o.status for o in outcomes] == ["raised", "raised"], outcomes
    assert "narrow.train" in outcomes[0].value, outcomes[0].value  # the agreement it joined
