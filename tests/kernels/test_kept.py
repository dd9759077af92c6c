"""Aggregations of unchanged inputs kept between calls (``kernels.kept``): the same bits as
aggregating again, never answered once anything they came from changed."""
import gc

import pytest
import torch
from torch import nn
from torch_geometric.nn import GINConv, GraphConv, SAGEConv, SGConv

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import kept

from kernel_testutils import fresh_kernel_state, random_features_graph

NOTHING = {"hits": 0, "kept": 0, "aggregations": 0, "bytes": 0}


@pytest.fixture(autouse=True)
def _fresh():
    with fresh_kernel_state(K.set_static_inputs):
        yield


def _graph(n=70, e=500, f=16, seed=0):
    return random_features_graph(n, e, f, seed=seed)


LAYERS = {
    "sage_mean": lambda: SAGEConv(16, 16),
    "sage_max": lambda: SAGEConv(16, 16, aggr="max"),
    "gin": lambda: GINConv(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))),
    "graph": lambda: GraphConv(16, 16),
    "sg": lambda: SGConv(16, 16, K=2),
}


def _step(conv, x, edge_index):
    out = conv(x, edge_index)
    return out.detach(), torch.autograd.grad(out.square().sum(), list(conv.parameters()))


def _equal(got, want):
    assert torch.equal(got[0], want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_static_input_is_aggregated_once_with_the_same_bits(kind):
    torch.manual_seed(0)
    x, edge_index = _graph()
    conv = LAYERS[kind]()
    K.set_static_inputs("off")
    with K.accelerate(conv, backend="auto"):
        want = _step(conv, x, edge_index)
    K.set_static_inputs(None)
    with K.accelerate(conv, backend="auto"):
        for _ in range(4):
            _equal(_step(conv, x, edge_index), want)
    # Kept at the second call (the same input again), answered in the next two. SGConv's second
    # hop aggregates its first hop's output: once that is the kept tensor, it is kept too (SGC's
    # precomputation, found by itself).
    hops = 2 if kind == "sg" else 1
    assert kept.info() == {"hits": 2 + hops - 1, "kept": hops, "aggregations": hops,
                           "bytes": hops * 70 * 16 * 4}


def test_new_inputs_are_never_kept():
    x, edge_index = _graph()
    conv = SAGEConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            conv(nn.functional.dropout(x, 0.5), edge_index)
    assert kept.info() == NOTHING


def test_an_aggregation_edited_in_place_is_aggregated_anew():
    # A propagate forward hook that edits the aggregation in place edits the kept tensor: the
    # next call sees its version changed and aggregates again.
    x, edge_index = _graph()
    conv = SAGEConv(16, 16)
    K.set_static_inputs("off")
    with K.accelerate(conv, backend="auto"):
        want = _step(conv, x, edge_index)
    K.set_static_inputs(None)
    conv.register_propagate_forward_hook(lambda module, inputs, out: (out.add_(1.0), None)[1])
    with K.accelerate(conv, backend="auto"):
        hooked = [_step(conv, x, edge_index) for _ in range(4)]
    for got in hooked:
        _equal(got, hooked[0])
    assert not torch.equal(hooked[0][0], want[0])  # the hook did act
    assert kept.info()["hits"] == 0


def test_calls_a_pre_hook_rewrites_are_not_kept():
    # The distributed engine's propagate pre-hooks rewrite the call (halo rows): its own static
    # cache decides there.
    x, edge_index = _graph()
    conv = SAGEConv(16, 16)
    conv.register_propagate_forward_pre_hook(lambda module, inputs: None)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            conv(x, edge_index)
    assert kept.info() == NOTHING


def test_edits_of_the_input_or_graph_are_not_served_stale():
    x, edge_index = _graph()
    conv = GraphConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            conv(x, edge_index)
        assert kept.info()["hits"] == 1
        edge_index[0, :10] = edge_index[0, 10:20]  # the graph edited in place
        got_graph = _step(conv, x, edge_index)
        x[:5] = 0.0  # the features edited in place
        got_x = _step(conv, x, edge_index)
        assert kept.info()["hits"] == 1
    K.set_static_inputs("off")
    with K.accelerate(conv, backend="auto"):
        _equal(got_x, _step(conv, x, edge_index))
    assert not torch.equal(got_graph[0], got_x[0])


def test_at_most_size_kept_and_each_gone_with_its_input():
    edge_index = _graph()[1]
    convs = [GraphConv(16, 16) for _ in range(kept.SIZE + 2)]
    xs = [torch.randn(70, 16) for _ in convs]
    for conv, x in zip(convs, xs):
        with K.accelerate(conv, backend="auto"):
            for _ in range(2):
                conv(x, edge_index)
    assert kept.info()["kept"] == kept.SIZE + 2 and kept.info()["aggregations"] == kept.SIZE
    del xs, x
    gc.collect()
    assert kept.info()["aggregations"] == 0


def test_inference_and_16_bit_rows_are_not_kept():
    x, edge_index = _graph()
    conv = GraphConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        with torch.inference_mode():
            for _ in range(3):
                conv(x, edge_index)
        conv16, x16 = GraphConv(16, 16).to(torch.bfloat16), x.to(torch.bfloat16)
        with K.accelerate(conv16, backend="auto"):
            for _ in range(3):
                conv16(x16, edge_index)
    assert kept.info() == NOTHING


def test_a_backend_switched_to_aggregates_anew():
    x, edge_index = _graph()
    conv = GraphConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        for _ in range(3):
            conv(x, edge_index)
    with K.accelerate(conv, backend="torch"):
        for _ in range(2):
            conv(x, edge_index)
    # Not answered from the C++ kernels' aggregation: kept anew for the reference backend, and
    # answered from that one after.
    assert kept.info()["hits"] == 2 and kept.info()["kept"] == 2


def test_under_torch_compile_results_follow_edits():
    x, edge_index = _graph()
    conv = GraphConv(16, 16)
    with K.accelerate(conv, backend="auto"):
        compiled = torch.compile(conv, backend="eager")
        for _ in range(3):
            compiled(x, edge_index)
        x.mul_(2)  # edited in place: a compiled call must not answer with the old aggregation
        got = compiled(x, edge_index)
    K.set_static_inputs("off")
    torch.testing.assert_close(got, conv(x, edge_index), rtol=0, atol=0)


def test_an_edge_index_graph_is_kept_like_a_tensor():
    # PyG's EdgeIndex is a wrapper subclass without a storage of its own (PyG's own
    # test_graph_conv crashed here: "Attempted to access the data pointer on an invalid python
    # storage"); its data tensor identifies it.
    from torch_geometric import EdgeIndex
    torch.manual_seed(0)
    x = torch.randn(6, 8)
    edge_index = EdgeIndex(torch.tensor([[0, 1, 2, 3, 4, 5, 0], [1, 2, 3, 4, 5, 0, 3]]),
                           sparse_size=(6, 6)).sort_by("col")[0]
    conv = GraphConv(8, 16)
    expected = conv(x, edge_index.as_tensor())
    with K.accelerate(conv, backend="auto"):
        first = conv(x, edge_index)
        again = conv(x, edge_index)
    assert torch.allclose(first, expected, atol=1e-5) and torch.allclose(again, expected,
                                                                         atol=1e-5)
