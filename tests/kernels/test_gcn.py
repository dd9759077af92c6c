"""GCNConv's forward with the kernels (``kernels.gcn``): the normalization memoized per input
graph and the bias added in place, bit-identical to PyG's forward, recomputed whenever the
inputs could have changed."""
import gc
import weakref

import pytest
import torch
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv import gcn_conv

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import gcn


@pytest.fixture(autouse=True)
def _fresh_memo():
    gcn.clear_memo()
    yield
    gcn.clear_memo()


def _graph(n=60, e=400, f=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, f, generator=g, dtype=dtype), torch.randint(0, n, (2, e), generator=g),
            torch.rand(e, generator=g, dtype=dtype))


def _run(conv, x, edge_index, edge_weight=None):
    x = x.detach().requires_grad_()
    out = conv(x, edge_index, edge_weight)
    inputs = [x] + [p for p in conv.parameters() if p.requires_grad]
    if edge_weight is not None and edge_weight.requires_grad:
        inputs.append(edge_weight)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    return out.detach(), grads


def _same(got, want):
    assert torch.equal(got[0], want[0])
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1]):
        assert torch.equal(a, b)


def _accelerated(conv):
    handle = K.accelerate(conv, backend="auto")
    assert "forward" in conv.__dict__
    return handle


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("options", [{}, {"improved": True}, {"add_self_loops": False},
                                     {"normalize": False}, {"bias": False}, {"cached": True}])
@pytest.mark.parametrize("weighted", [False, True])
def test_equals_pyg_forward_bit_for_bit(dtype, tol, options, weighted):
    # Bit-identical to PyG's forward on the same kernels; PyG's scatter path sums in another
    # order, so against that within tolerance.
    torch.manual_seed(0)
    conv = GCNConv(16, 8, **options).to(dtype)
    x, ei, w = _graph(dtype=dtype)
    w = w if weighted else None
    plain = _run(conv, x, ei, w)
    conv._cached_edge_index = None
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei, w)
        conv._cached_edge_index = None
        for _ in range(3):  # the first call fills the memo, the others read it
            _same(_run(conv, x, ei, w), want)
    assert "forward" not in conv.__dict__  # reverted with the kernels
    normalizes = options.get("normalize", True)
    assert gcn.memo_info()["misses"] == int(normalizes)  # a cached layer: its first call
    assert gcn.memo_info()["hits"] == (2 if normalizes and not options.get("cached") else 0)
    for a, b in zip([want[0], *want[1]], [plain[0], *plain[1]]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol * b.abs().max().item())


def test_layers_share_one_normalization_and_bias_goes_in_place():
    torch.manual_seed(0)
    convs = torch.nn.ModuleList([GCNConv(16, 16), GCNConv(16, 8)])
    x, ei, _ = _graph()
    want = convs[1](convs[0](x, ei).relu(), ei)
    with K.accelerate(convs, backend="auto"):
        h = convs[0](x, ei)
        assert h._version == 1  # the bias was added into the aggregation's own output
        got = convs[1](h.relu(), ei)
    torch.testing.assert_close(got, want)
    assert gcn.memo_info()["graphs"] == 1 and gcn.memo_info()["misses"] == 1
    assert gcn.memo_info()["hits"] == 1


def test_bias_out_of_place_where_the_output_may_be_held():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, _ = _graph()
    want = conv(x, ei)
    held = []
    with _accelerated(conv):
        with torch.no_grad():  # no autograd node to vouch for a fresh output
            out = conv(x, ei)
        assert out._version == 0 and torch.equal(out, want.detach())
        handle = conv.register_propagate_forward_hook(lambda m, a, o: held.append(o))
        out = conv(x, ei)
        handle.remove()
    assert out._version == 0 and torch.equal(out, want)
    assert torch.equal(held[0] + conv.bias, want)  # the hook's tensor was left as it was


def test_in_place_edits_and_new_tensors_recompute():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, w = _graph()
    with _accelerated(conv):
        conv(x, ei, w)
        ei[0, :10] = (ei[0, :10] + 1) % 60  # edited in place: the version counter moves
        _same(_run(conv, x, ei, w), _run_pyg(conv, x, ei, w))
        w.mul_(2.0)
        _same(_run(conv, x, ei, w), _run_pyg(conv, x, ei, w))
        w2 = w.clone()  # equal values, a new tensor: a new entry
        _same(_run(conv, x, ei, w2), _run_pyg(conv, x, ei, w2))
    assert gcn.memo_info()["misses"] == 4 and gcn.memo_info()["hits"] == 0


def _run_pyg(conv, x, ei, w=None):
    forward = conv.__dict__.pop("forward")
    try:
        return _run(conv, x, ei, w)
    finally:
        conv.__dict__["forward"] = forward


def test_a_returned_tensor_edited_in_place_is_recomputed():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, w = _graph()
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei, w)
        kept_ei, kept_w = gcn.normalize(ei, w, 60, False, True, "source_to_target", x.dtype)
        kept_w.zero_()
        _same(_run(conv, x, ei, w), want)
    assert gcn.memo_info()["misses"] == 2


def test_weights_that_require_grad_are_not_kept():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, w = _graph()
    w.requires_grad_()
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei, w)
        for _ in range(2):
            _same(_run(conv, x, ei, w), want)  # the edge weights' gradient too
    assert gcn.memo_info() == {"hits": 0, "misses": 0, "graphs": 0, "bytes": 0}


def test_inference_mode_results_are_not_kept_for_training():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, w = _graph()
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei, w)
        with torch.inference_mode():
            conv(x, ei, w)
        assert gcn.memo_info()["graphs"] == 0
        _same(_run(conv, x, ei, w), want)  # would fail on a kept inference tensor


def test_a_replaced_gcn_norm_is_called_every_time(monkeypatch):
    # The distributed engine replaces gcn_norm (halo degrees): its calls are not memoized.
    calls = []
    original = gcn_conv.gcn_norm

    def replaced(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(gcn_conv, "gcn_norm", replaced)
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, _ = _graph()
    with _accelerated(conv):
        for _ in range(3):
            conv(x, ei)
    assert len(calls) == 3 and gcn.memo_info()["graphs"] == 0


def test_entries_go_with_their_graph_and_the_memo_is_bounded():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, _ = _graph()
    with _accelerated(conv):
        conv(x, ei)
        assert gcn.memo_info()["graphs"] == 1
        gone = weakref.ref(ei)
        del ei
        gc.collect()
        assert gone() is None and gcn.memo_info()["graphs"] == 0
        graphs = [_graph(seed=s)[1] for s in range(gcn.MEMO_SIZE + 2)]
        for g in graphs:
            conv(x, g)
        assert gcn.memo_info()["graphs"] == gcn.MEMO_SIZE
    K.clear_memos()
    assert gcn.memo_info()["graphs"] == 0


def test_a_returned_input_is_not_held_twice():
    # Without self-loops gcn_norm returns edge_index itself: the entry keeps its position,
    # so it holds the weights only (and no strong reference that would keep its key alive).
    torch.manual_seed(0)
    conv = GCNConv(16, 8, add_self_loops=False)
    x, ei, _ = _graph()
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei)
        _run(conv, x, ei)
        _same(_run(conv, x, ei), want)
    assert gcn.memo_info()["hits"] == 1
    assert gcn.memo_info()["bytes"] == ei.size(1) * 4  # float32 weights


def test_not_over_another_forward_nor_for_subclasses():
    class Mine(GCNConv):
        def forward(self, x, edge_index, edge_weight=None):
            return super().forward(x, edge_index, edge_weight) * 2

    assert not gcn.applies(Mine(4, 4)) and gcn.applies(GCNConv(4, 4))
    conv = GCNConv(16, 8)
    own = conv.forward
    conv.forward = lambda *a, **k: own(*a, **k)  # e.g. the engine's or a user's
    with K.accelerate(conv, backend="auto"):
        assert conv.__dict__["forward"] is not None
        assert getattr(conv.__dict__["forward"], "__wrapped__", None) is None
    x, ei, _ = _graph()
    with K.accelerate(Mine(16, 8), backend="auto") as handle:
        handle.modules[0](x, ei)
        assert "forward" not in handle.modules[0].__dict__


def test_autocast_keeps_pygs_promotion():
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, _ = _graph()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = conv(x, ei)
        with _accelerated(conv):
            got = conv(x, ei)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


# ------------------------------------------------- the other layers that normalize: the memo
def _normalizing_layers():
    from torch_geometric import nn as gnn
    return {
        "SGConv": lambda: gnn.SGConv(16, 8, K=2),
        "APPNP": lambda: gnn.APPNP(K=3, alpha=0.1),
        "TAGConv": lambda: gnn.TAGConv(16, 8, K=2),
        "GCN2Conv": lambda: gnn.GCN2Conv(16, alpha=0.1, theta=0.5, layer=1),
    }


def _call(layer, x, ei, w):
    from torch_geometric.nn import GCN2Conv
    if isinstance(layer, GCN2Conv):
        return layer(x, x, ei, w)
    return layer(x, ei, w)


def _run_any(layer, x, ei, w=None):
    x = x.detach().requires_grad_()
    out = _call(layer, x, ei, w)
    grads = torch.autograd.grad(out.square().sum(), [x] + list(layer.parameters()))
    return out.detach(), grads


def _count_pyg_calls(monkeypatch):
    from lightning_fullgraph import compat
    calls = []
    original = compat.pyg_gcn_norm()

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    compat.gcn_norm_router()  # made, holding PyG's function in its box
    monkeypatch.setitem(compat._gcn_norm_box, "pyg", counted)
    return calls


@pytest.mark.parametrize("name", ["SGConv", "APPNP", "TAGConv", "GCN2Conv"])
@pytest.mark.parametrize("weighted", [False, True])
def test_normalizing_layers_read_the_memo_bit_for_bit(name, weighted, monkeypatch):
    torch.manual_seed(0)
    layer = _normalizing_layers()[name]()
    assert gcn.normalizes(layer) and not gcn.applies(layer)
    x, ei, w = _graph()
    w = w if weighted else None
    with K.accelerate(layer, backend="auto"):
        assert "forward" in layer.__dict__
        forward = layer.__dict__.pop("forward")  # PyG's forward on the same kernels
        want = _run_any(layer, x, ei, w)
        layer.__dict__["forward"] = forward
        calls = _count_pyg_calls(monkeypatch)
        for _ in range(3):
            got = _run_any(layer, x, ei, w)
            assert torch.equal(got[0], want[0])
            assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert len(calls) == 1  # normalized once, read twice
    assert gcn.memo_info()["hits"] == 2
    assert "forward" not in layer.__dict__


def test_the_memo_is_routed_while_a_layer_is_accelerated_and_only_inside_it(monkeypatch):
    from torch_geometric.nn import APPNP
    from torch_geometric.nn.conv import appnp
    from lightning_fullgraph import compat
    torch.manual_seed(0)
    fast, plain = APPNP(K=2, alpha=0.1), APPNP(K=2, alpha=0.1)
    x, ei, _ = _graph()
    pyg = compat.pyg_gcn_norm()
    with K.accelerate(fast, backend="auto"):
        assert appnp.gcn_norm is compat.gcn_norm_router()
        assert gcn_conv.gcn_norm is compat.gcn_norm_router()
        calls = _count_pyg_calls(monkeypatch)
        for _ in range(2):
            plain(x, ei)  # not accelerated: PyG's gcn_norm every time
        assert len(calls) == 2 and gcn.memo_info()["graphs"] == 0
        for _ in range(2):
            fast(x, ei)
        assert len(calls) == 3 and gcn.memo_info()["hits"] == 1
    assert appnp.gcn_norm is pyg and gcn_conv.gcn_norm is pyg  # reverted
    assert not compat._gcn_norm_handlers


def test_the_engine_handler_goes_first_whatever_the_order_of_routing():
    # The engine answers inside a partitioned layer (halo degrees) even when the kernels
    # routed their memo before it; outside one it passes the call on.
    from lightning_fullgraph import compat
    from lightning_fullgraph.engine import norm as engine_norm
    from torch_geometric.nn import APPNP
    layer = APPNP(K=1, alpha=0.1)
    with K.accelerate(layer, backend="auto"):
        engine_norm.add_dispatcher()
        try:
            handlers = [h for *_, h in compat._gcn_norm_handlers]
            assert handlers[0] is engine_norm._dispatch_gcn_norm and handlers[1] is gcn._handler
            x, ei, _ = _graph()
            layer(x, ei)
            layer(x, ei)
            assert gcn.memo_info()["hits"] == 1  # no partitioned layer: the memo answered
        finally:
            engine_norm.remove_dispatcher()
        assert [h for *_, h in compat._gcn_norm_handlers] == [gcn._handler]
    assert not compat._gcn_norm_handlers


def test_normalizing_layers_under_torch_compile():
    from torch_geometric.nn import APPNP
    torch.manual_seed(0)
    layer = APPNP(K=2, alpha=0.1)
    x, ei, w = _graph()
    want = layer(x, ei, w)
    with K.accelerate(layer, backend="auto"):
        compiled = torch.compile(layer, backend="eager")
        got = compiled(x, ei, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert gcn.memo_info()["graphs"] == 0  # traced as PyG's forward: nothing kept


def test_the_kept_edge_list_is_destination_sorted_and_its_csr_needs_no_permutation():
    from lightning_fullgraph.kernels.csr import get_csr
    torch.manual_seed(0)
    conv = GCNConv(16, 8)
    x, ei, w = _graph()
    with _accelerated(conv):
        want = _run_pyg(conv, x, ei, w)  # gcn_norm's own order: a permuted CSR
        _same(_run(conv, x, ei, w), want)
        kept = gcn.normalize(ei, w, x.size(0), False, True, "source_to_target", x.dtype)
    looped, _ = gcn_conv.gcn_norm(ei, w, x.size(0))
    assert kept[0].size(1) == looped.size(1) and bool((kept[0][1].diff() >= 0).all())
    assert get_csr(kept[0], x.size(0), x.size(0)).perm is None
    assert get_csr(looped, x.size(0), x.size(0)).perm is not None


def test_a_first_call_in_pygs_forward_uses_the_memo():
    # With K.use(), torch picks a layer's forward before the hook that installs the kernels'
    # runs, so its first call is PyG's forward; that call's gcn_norm is answered from the
    # memo all the same, so the kernels never build a CSR of the unsorted list (on 1M nodes /
    # 16M edges one stayed cached beside the sorted list's: 405 MiB).
    from lightning_fullgraph.kernels import csr
    K.clear_memos()
    gcn.clear_memo()
    torch.manual_seed(0)
    convs = torch.nn.ModuleList([GCNConv(16, 16), GCNConv(16, 8)])
    x, ei, _ = _graph()
    with torch.no_grad():
        want = convs[1](convs[0](x, ei).relu(), ei)
    with K.use("auto"):
        for step in range(3):
            out = convs[1](convs[0](x, ei).relu(), ei)
            if step == 0:
                assert gcn.memo_info()["misses"] == 1 and gcn.memo_info()["hits"] == 1
                assert csr.memo_info()["size"] == 1  # the sorted list's, from the first call
                torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
            out.square().sum().backward()
        assert gcn.memo_info()["misses"] == 1
        assert getattr(gcn._scope, "depth", 0) == 0  # the first calls' scopes were left
        assert not any(c._forward_hooks for c in convs)  # and their hooks removed
    assert csr.memo_info()["size"] == 1
    ((_, built, (edge_index,), _),) = csr._memo.items()
    assert built.perm is None and bool((edge_index[1].diff() >= 0).all())


def test_a_failing_first_call_leaves_the_memo_scope():
    K.clear_memos()
    conv = GCNConv(16, 8)
    x, ei, _ = _graph()
    with K.use("auto"):
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            conv(x[:, :5], ei)  # wrong width: lin fails inside PyG's forward
        assert getattr(gcn._scope, "depth", 0) == 0
        conv(x, ei)  # the next call is the kernels' forward, outside any scope afterwards
        assert getattr(gcn._scope, "depth", 0) == 0 and not conv._forward_hooks
    K.clear_memos()


def test_forget_drops_the_structures_of_equal_edge_lists():
    from lightning_fullgraph.kernels import csr
    K.clear_memos()
    _, ei, _ = _graph()
    csr.get_csr(ei, 60, 60)
    csr.get_split_csr(ei, 30, 60, 60)
    other = torch.randint(0, 60, (2, 100))
    csr.get_csr(other, 60, 60)
    assert csr.forget(ei.clone()) == 2  # by content, every kind
    assert csr.memo_info()["size"] == 1
    assert csr.forget(ei) == 0
    K.clear_memos()
