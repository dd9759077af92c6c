"""Composition with propagate pre/post hooks, as used by the distributed engine."""
import copy

import pytest
import torch
import torch_geometric.nn as gnn

import lightning_fullgraph.kernels as K
from kernel_testutils import make_graph

N_OWN, N_HALO, F = 20, 9, 6


def _halo_hook(halos, n_src, n_dst, ei_local, calls):
    """Engine-like pre-hook: swap in halo-extended features, rectangular size and local edges."""

    def hook(module, inputs):
        calls.append(1)
        _, _, kwargs = inputs
        kwargs = dict(kwargs)
        own = kwargs["x"][0] if isinstance(kwargs["x"], tuple) else kwargs["x"]
        x_ext = torch.cat([own, halos(own.size(1))])  # halo rows of the layer's width
        kwargs["x"] = (x_ext, own)
        return ei_local, (n_src, n_dst), kwargs

    return hook


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("name", ["GCNConv", "SAGEConv", "GraphConv"])
def test_engine_style_pre_hook(backend, name):
    torch.manual_seed(0)
    n_src, n_dst = N_OWN + N_HALO, N_OWN
    ei_local = make_graph(n_src, n_dst, 120)
    x_own = torch.randn(N_OWN, F, requires_grad=True)
    halo = torch.randn(N_HALO, F, requires_grad=True)
    halos = lambda width: halo if width == F else halo[:, :width] * 2
    if name == "GCNConv":
        # normalize=False: the engine hands already-normalised local graphs to GCN.
        layer = gnn.GCNConv(F, 4, normalize=False)
        call = lambda m: m(x_own, ei_local[:, :0].clone(), None)
    elif name == "SAGEConv":
        layer = gnn.SAGEConv(F, 4)
        call = lambda m: m(x_own, ei_local[:, :0].clone())
    else:
        layer = gnn.GraphConv(F, 4)
        call = lambda m: m(x_own, ei_local[:, :0].clone())
    ref_layer = copy.deepcopy(layer)

    results = []
    for mod, accel in ((ref_layer, False), (layer, True)):
        pre_calls, post_calls = [], []
        mod.register_propagate_forward_pre_hook(_halo_hook(halos, n_src, n_dst, ei_local, pre_calls))
        mod.register_propagate_forward_hook(lambda m, inp, out: post_calls.append(1))
        handle = K.accelerate(mod, backend=backend) if accel else None
        out = call(mod)
        grads = torch.autograd.grad(out.sum(), [x_own, halo])
        assert len(pre_calls) == 1 and len(post_calls) == 1, "hooks must run exactly once"
        assert out.shape[0] == n_dst
        results.append((out, grads))
        if handle:
            handle.revert()
    (ref, ref_g), (got, got_g) = results
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(got_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_hook_making_call_unsupported_runs_pyg_once():
    """A pre-hook that swaps in a SparseTensor-like input must not run twice."""
    torch.manual_seed(0)
    layer = gnn.GraphConv(F, 4)
    ei = make_graph(N_OWN, N_OWN, 80)
    x = torch.randn(N_OWN, F)
    calls = []

    def hook(module, inputs):
        calls.append(1)
        edge_index, size, kwargs = inputs
        kwargs = dict(kwargs)
        kwargs["edge_weight"] = torch.ones(edge_index.size(1), 1)  # 2-D weight: unsupported by kernels
        return edge_index, size, kwargs

    ref = copy.deepcopy(layer)
    ref.register_propagate_forward_pre_hook(hook)
    expected = ref(x, ei)
    layer.register_propagate_forward_pre_hook(hook)
    calls.clear()
    with K.accelerate(layer, backend="cpp"):
        out = layer(x, ei)
    assert len(calls) == 1
    torch.testing.assert_close(out, expected)


def test_revert_restores_instance_attribute():
    layer = gnn.GCNConv(F, 4)
    assert "propagate" not in layer.__dict__
    handle = K.accelerate(layer)
    assert "propagate" in layer.__dict__
    handle.revert()
    assert "propagate" not in layer.__dict__
    handle.revert()  # idempotent
