"""The pieces of the engine's pre/hybrid ``gcn_norm`` that avoid copying the edge list
equal what PyG's ``add_remaining_self_loops`` gives, and the router never takes the user's
edge list for one it made."""
from types import SimpleNamespace

import pytest
import torch
from torch_geometric.utils import add_remaining_self_loops, scatter

from lightning_fullgraph.engine.aggregation import AggregationRouter
from lightning_fullgraph.engine.norm import _owned_degree, _self_loop_values
from lightning_fullgraph.partition import build_local_partitions
from lightning_fullgraph.engine import ExchangeConfig


def _graph_with_self_loops(n=30, e=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    loops = torch.tensor([[3, 3, 7, 12], [3, 3, 7, 12]])  # one duplicated
    ei = torch.cat([ei, loops], dim=1)
    w = torch.rand(ei.size(1), generator=g, dtype=torch.float64) + 0.1
    return ei, w, n


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("loops", [False, True])
def test_owned_degree_equals_the_looped_list(weighted, improved, loops):
    ei, w, n = _graph_with_self_loops()
    w = w if weighted else None
    fill = 2. if improved else 1.
    index, weight = (add_remaining_self_loops(ei, w, fill, n) if loops else (ei, w))
    if weight is None:
        weight = torch.ones(index.size(1), dtype=torch.float64)
    expected = scatter(weight, index[1], dim=0, dim_size=n, reduce='sum')
    got = _owned_degree(ei, w, fill, n, loops, torch.float64)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("improved", [False, True])
def test_self_loop_values_equal_pyg(improved):
    ei, w, n = _graph_with_self_loops(seed=1)
    fill = 2. if improved else 1.
    _, expected = add_remaining_self_loops(ei, w, fill, n)
    assert torch.equal(_self_loop_values(ei, w, fill, n), expected)


def test_shared_in_edge_list_is_not_taken_for_a_mode_graph():
    from lightning_fullgraph.data import load_cora
    cora_data = load_cora()
    # One part: the hybrid plan shares the partition's edge list.  The router hands out a
    # distinct tensor for it, so the user's edge_index still goes through the agreement.
    lp = build_local_partitions(cora_data, torch.zeros(cora_data.num_nodes,
                                                       dtype=torch.long))[0]
    exchanges = {m: SimpleNamespace(plan=lp.plan(m)) for m in ("post", "hybrid")}
    router = AggregationRouter(lp, exchanges, mode="hybrid")
    edges = router.mode_edge_index("hybrid", torch.device("cpu"))
    assert edges is not lp.edge_index and torch.equal(edges, lp.edge_index)
    assert router.graph_mode(edges) == "hybrid"
    assert router.graph_mode(lp.edge_index) is None


@pytest.mark.parametrize("mode", ["hybrid", "pre"])
def test_looped_edge_list_is_the_plans_buffer_not_a_copy(mode):
    # The mode's edges and the self-loops gcn_norm appends share one storage; the result is
    # exactly add_remaining_self_loops'.  With a self-loop of its own the copy is made.
    from lightning_fullgraph.data import load_cora
    from lightning_fullgraph.engine.norm import _plan_looped
    from lightning_fullgraph.partition import metis_partition
    data = load_cora()
    parts = metis_partition(data.edge_index, data.num_nodes, 3, seed=0)
    lp = build_local_partitions(data, parts)[1]
    plan = lp.plan(mode)
    index, n = plan.edge_index, lp.num_owned
    looped = _plan_looped(plan, index, n)
    assert looped is not None and looped.untyped_storage().data_ptr() == \
        index.untyped_storage().data_ptr()
    assert torch.equal(looped, add_remaining_self_loops(index, None, 1., n)[0])
    copy = index.clone()
    assert _plan_looped(plan, copy, n) is None  # another storage
    with_loop = plan.looped.clone()
    own = SimpleNamespace(looped=with_loop)
    view = with_loop[:, :index.size(1)]
    view[1, 0] = view[0, 0]  # the first edge becomes a self-loop
    assert int(view[0, 0]) < n and _plan_looped(own, view, n) is None


def _normalized_weights(rank, world_size, options):
    from torch_geometric.nn import GCNConv

    from lightning_fullgraph.engine import FullGraphEngine
    from lightning_fullgraph.partition import metis_partition

    from .models import skewed_graph
    data = skewed_graph()
    parts = metis_partition(data.edge_index, data.num_nodes, world_size, seed=0)
    part = build_local_partitions(data, parts)[rank]
    weights = []
    for kwargs in ({}, options):
        torch.manual_seed(0)
        conv = GCNConv(data.num_features, 4)
        engine = FullGraphEngine(part, exchange=ExchangeConfig(aggregation="post",
                                                               step_aside=False, **kwargs))
        engine.attach(conv)
        local = engine.data
        conv(local.x, local.edge_index, local.edge_weight).sum().backward()
        (_, weight), = {id(v): v for v in engine.static._norms.values()}.values()
        weights.append(weight.detach())
        engine.detach()
    return torch.equal(*weights)


@pytest.mark.multiprocess
@pytest.mark.parametrize("options", [{"codec": "bf16"}, {"codec": "int2"},
                                     {"sampling": 0.5}, {"cache": 0.1}])
def test_halo_degrees_travel_exact(options):
    # Degrees are the graph, not features: a normalization computed once from halo degrees
    # rounded by the codec or sampled (and rescaled by 1/p) would be wrong for every step.
    from lightning_fullgraph.testing import run_distributed
    assert all(run_distributed(_normalized_weights, 2, options))
