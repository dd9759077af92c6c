"""Unmodified PyG layers give PyG's outputs and gradients with the backend on and off."""
import copy

import pytest
import torch
import torch_geometric.nn as gnn
from torch_geometric import EdgeIndex

import lightning_fullgraph.kernels as K
from kernel_testutils import make_graph

BACKENDS = ["cpp", "torch"]
N, F_IN, F_OUT = 40, 12, 8


def _grads(module, out, tensors):
    g = torch.Generator().manual_seed(1)
    cot = torch.randn(out.shape, generator=g)
    params = [p for p in module.parameters() if p.requires_grad]
    leaves = [t for t in tensors if t is not None and t.requires_grad] + params
    return torch.autograd.grad(out, leaves, cot, allow_unused=True)


def _compare(make, call, backend, *, n_src=N, weighted=True, edge_index=None, tensors_fn=None):
    torch.manual_seed(0)
    layer = make()
    ei = edge_index if edge_index is not None else make_graph(n_src, n_src, 300)
    x = torch.randn(n_src, F_IN, requires_grad=True)
    w = (torch.rand(ei.size(1)) + 0.1).requires_grad_() if weighted else None

    ref_layer = copy.deepcopy(layer)
    ref = call(ref_layer, x, ei, w)
    ref_g = _grads(ref_layer, ref, [x, w])

    handle = K.accelerate(layer, backend=backend)
    assert K.is_accelerated(layer)
    before = K.memo_info()["hits"] + K.memo_info()["misses"]
    out = call(layer, x, ei, w)
    assert K.memo_info()["hits"] + K.memo_info()["misses"] > before, "kernel path not taken"
    got_g = _grads(layer, out, [x, w])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_g, ref_g):
        if a is None or b is None:
            assert a is None and b is None
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    handle.revert()
    assert not K.is_accelerated(layer)
    return layer


GCN_OPTIONS = [dict(), dict(improved=True), dict(cached=True), dict(add_self_loops=False),
               dict(normalize=False), dict(normalize=False, add_self_loops=False)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opts", GCN_OPTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn(backend, opts, weighted):
    _compare(lambda: gnn.GCNConv(F_IN, F_OUT, **opts), lambda m, x, ei, w: m(x, ei, w), backend,
             weighted=weighted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "max", "sum"])
@pytest.mark.parametrize("opts", [dict(), dict(root_weight=False), dict(normalize=True), dict(project=True)])
def test_sage(backend, aggr, opts):
    _compare(lambda: gnn.SAGEConv(F_IN, F_OUT, aggr=aggr, **opts), lambda m, x, ei, w: m(x, ei), backend,
             weighted=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train_eps", [False, True])
def test_gin(backend, train_eps):
    mlp = lambda: torch.nn.Sequential(torch.nn.Linear(F_IN, 16), torch.nn.ReLU(), torch.nn.Linear(16, F_OUT))
    _compare(lambda: gnn.GINConv(mlp(), train_eps=train_eps), lambda m, x, ei, w: m(x, ei), backend,
             weighted=False)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["add", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True])
def test_graphconv(backend, aggr, weighted):
    _compare(lambda: gnn.GraphConv(F_IN, F_OUT, aggr=aggr), lambda m, x, ei, w: m(x, ei, w), backend,
             weighted=weighted)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("name", ["SGConv", "APPNP", "TAGConv", "GCN2Conv"])
def test_propagation_layers(backend, weighted, name):
    if name == "SGConv":
        make, call = lambda: gnn.SGConv(F_IN, F_OUT, K=2), lambda m, x, ei, w: m(x, ei, w)
    elif name == "APPNP":
        make, call = lambda: gnn.APPNP(K=3, alpha=0.1), lambda m, x, ei, w: m(x, ei, w)
    elif name == "TAGConv":
        make, call = lambda: gnn.TAGConv(F_IN, F_OUT, K=2), lambda m, x, ei, w: m(x, ei, w)
    else:
        make = lambda: gnn.GCN2Conv(F_IN, alpha=0.2, theta=0.5, layer=1)
        call = lambda m, x, ei, w: m(x, x * 0.5, ei, w)
    _compare(make, call, backend, weighted=weighted)


# ---------------------------------------------------------------- bipartite inputs
def _bipartite(make, call, backend, weighted=False):
    torch.manual_seed(0)
    n_src, n_dst = 30, 13
    ei = make_graph(n_src, n_dst, 150)
    xs = torch.randn(n_src, F_IN, requires_grad=True)
    xd = torch.randn(n_dst, F_IN, requires_grad=True)
    w = (torch.rand(ei.size(1)) + 0.1).requires_grad_() if weighted else None
    layer = make()
    ref_layer = copy.deepcopy(layer)
    ref = call(ref_layer, (xs, xd), ei, w, (n_src, n_dst))
    handle = K.accelerate(layer, backend=backend)
    out = call(layer, (xs, xd), ei, w, (n_src, n_dst))
    assert out.shape[0] == n_dst
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(_grads(layer, out, [xs, xd, w]), _grads(ref_layer, ref, [xs, xd, w])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    handle.revert()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("aggr", ["mean", "max", "sum"])
def test_sage_bipartite(backend, aggr):
    _bipartite(lambda: gnn.SAGEConv((F_IN, F_IN), F_OUT, aggr=aggr), lambda m, x, ei, w, s: m(x, ei, size=s),
               backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gin_graphconv_bipartite(backend):
    mlp = torch.nn.Linear(F_IN, F_OUT)
    _bipartite(lambda: gnn.GINConv(mlp, train_eps=True), lambda m, x, ei, w, s: m(x, ei, size=s), backend)
    _bipartite(lambda: gnn.GraphConv((F_IN, F_IN), F_OUT), lambda m, x, ei, w, s: m(x, ei, w, size=s), backend,
               weighted=True)


# ---------------------------------------------------------------- EdgeIndex inputs
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sort", [None, "col", "row"])
def test_edge_index_inputs(backend, sort):
    ei = EdgeIndex(make_graph(N, N, 300), sparse_size=(N, N))
    if sort is not None:
        ei = ei.sort_by(sort)[0]
    _compare(lambda: gnn.SAGEConv(F_IN, F_OUT), lambda m, x, e, w: m(x, e), backend, weighted=False, edge_index=ei)
    _compare(lambda: gnn.GraphConv(F_IN, F_OUT), lambda m, x, e, w: m(x, e), backend, weighted=False, edge_index=ei)


# ---------------------------------------------------------------- unsupported layers
def test_gat_untouched():
    layer = gnn.GATConv(F_IN, F_OUT, heads=2)
    handle = K.accelerate(layer)
    assert handle.modules == [] and not K.is_accelerated(layer)
    ei = make_graph(N, N, 300)
    x = torch.randn(N, F_IN)
    with K.use("cpp"):
        a = layer(x, ei)
        assert not K.is_accelerated(layer)
    torch.testing.assert_close(a, layer(x, ei))


def test_lstm_aggr_and_overridden_message_fall_back():
    class Scaled(gnn.GraphConv):
        def message(self, x_j, edge_weight):
            return 2 * super().message(x_j, edge_weight)

    ei = make_graph(N, N, 300)
    ei = ei[:, torch.argsort(ei[1], stable=True)]  # LSTM aggregation needs sorted edges
    x = torch.randn(N, F_IN)
    for layer in (gnn.SAGEConv(F_IN, F_OUT, aggr="lstm"), Scaled(F_IN, F_OUT)):
        ref = layer(x, ei)
        with K.accelerate(layer, backend="cpp"):
            torch.testing.assert_close(layer(x, ei), ref)


# ---------------------------------------------------------------- switch semantics
def test_use_context_and_plain_call():
    layer = gnn.GCNConv(F_IN, F_OUT)
    ei = make_graph(N, N, 300)
    x = torch.randn(N, F_IN)
    ref = layer(x, ei)
    with K.use("cpp"):
        assert K.current() == "cpp"
        torch.testing.assert_close(layer(x, ei), ref, rtol=1e-5, atol=1e-5)
        assert K.is_accelerated(layer)
    assert K.current() is None and not K.is_accelerated(layer)
    K.use("torch")
    try:
        torch.testing.assert_close(layer(x, ei), ref, rtol=1e-5, atol=1e-5)
        assert K.is_accelerated(layer)
    finally:
        K.use(None)
    assert not K.is_accelerated(layer)
    with pytest.raises(ValueError):
        K.use("cuda-magic")


def test_register_user_layer():
    from torch_geometric.nn import MessagePassing

    class MyConv(MessagePassing):
        def __init__(self):
            super().__init__(aggr="mean")

        def forward(self, x, edge_index, w):
            return self.propagate(edge_index, x=x, w=w)

        def message(self, x_j, w):
            return w.view(-1, 1) * x_j

    layer = MyConv()
    assert K.accelerate(layer).modules == []
    K.register_layer(MyConv, x="x", weight="w")
    _compare(MyConv, lambda m, x, ei, w: m(x, ei, w), "cpp")


# ---------------------------------------------------------------- torch.compile
def test_gcn_torch_compile():
    torch.manual_seed(0)
    layer = gnn.GCNConv(F_IN, F_OUT)
    ei = make_graph(N, N, 300)
    x = torch.randn(N, F_IN, requires_grad=True)
    w = torch.rand(ei.size(1))
    ref = layer(x, ei, w)
    ref_g = torch.autograd.grad(ref.sum(), [x, layer.lin.weight])
    handle = K.accelerate(layer, backend="cpp")
    compiled = torch.compile(layer)
    before = K.memo_info()["hits"] + K.memo_info()["misses"]
    out = compiled(x, ei, w)
    assert K.memo_info()["hits"] + K.memo_info()["misses"] > before, "kernel path not taken"
    got_g = torch.autograd.grad(out.sum(), [x, layer.lin.weight])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    handle.revert()


def test_accelerate_takes_over_lazily_installed_wrapper():
    layer = gnn.GCNConv(F_IN, F_OUT)
    ei = make_graph(N, N, 300)
    x = torch.randn(N, F_IN)
    ref = layer(x, ei)
    K.use("torch")
    try:
        layer(x, ei)  # lazily wrapped by the global switch
        handle = K.accelerate(layer, backend="cpp")
        assert handle.modules == [layer]
    finally:
        K.use(None)
    assert K.is_accelerated(layer)  # switching the global backend off keeps accelerate()'s wrapper
    torch.testing.assert_close(layer(x, ei), ref, rtol=1e-5, atol=1e-5)
    handle.revert()
    assert not K.is_accelerated(layer)
