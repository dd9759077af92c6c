"""``torch.jit.script`` of a layer the kernels accelerate scripts PyG's own layer (PyG's conv
tests script layers while the kernels are on): the layer's instance ``forward``/``propagate``
and the routed ``gcn_norm`` are the kernels', which TorchScript cannot compile."""
import warnings

import pytest
import torch
from torch_geometric.nn import APPNP, GCNConv, GraphConv, SAGEConv, SGConv, TAGConv

import lightning_fullgraph.kernels as K

LAYERS = {
    "gcn": lambda: GCNConv(16, 32),
    "sage": lambda: SAGEConv(16, 32),
    "graph_narrow": lambda: GraphConv(16, 4),
    "tag": lambda: TAGConv(16, 8),
    "sg": lambda: SGConv(16, 8),
    "appnp": lambda: APPNP(2, 0.1),
}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is deprecated
        yield


@pytest.mark.parametrize("name", LAYERS)
def test_an_accelerated_layer_scripts_as_pyg_scripts_it(name):
    torch.manual_seed(0)
    x, edge_index = torch.randn(5, 16), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    conv = LAYERS[name]()
    with K.use("cpp"):
        conv(x, edge_index)
        out = conv(x, edge_index)  # fused forwards take over from the second call
        assert K.is_accelerated(conv)
        scripted = torch.jit.script(conv)
        assert torch.allclose(scripted(x, edge_index), out, atol=1e-6)
        assert K.is_accelerated(conv)  # the layer itself keeps the kernels
        assert torch.equal(conv(x, edge_index), out)
    assert "__prepare_scriptable__" not in conv.__dict__  # gone with the kernels
    assert torch.allclose(scripted(x, edge_index), out, atol=1e-6)


def test_a_layer_scripts_while_gcn_norm_is_routed():
    # PyG's modules bind the router while a model is attached or accelerated; TorchScript
    # compiles PyG's own gcn_norm from it.
    from torch_geometric.nn.conv import gcn_conv

    from lightning_fullgraph import compat
    handler = lambda *args, **kwargs: NotImplemented  # noqa: E731
    compat.route_gcn_norm(handler)
    try:
        assert gcn_conv.gcn_norm is compat.gcn_norm_router()
        conv = GCNConv(16, 8)
        x, edge_index = torch.randn(4, 16), torch.tensor([[0, 1, 2], [1, 2, 3]])
        assert torch.allclose(torch.jit.script(conv)(x, edge_index), conv(x, edge_index),
                              atol=1e-6)
    finally:
        compat.unroute_gcn_norm(handler)
    assert gcn_conv.gcn_norm is compat.pyg_gcn_norm()
