"""A narrowing SAGEConv maps its rows before aggregating them (``kernels.sage_reorder``): equal
to PyG's order within floating-point reassociation, aggregating F_out-wide rows; PyG's order
wherever the other could be seen, is not linear, or a static input is kept instead."""
import pytest
import torch
from torch_geometric.nn import SAGEConv

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import kept

from kernel_testutils import fresh_kernel_state, random_features_graph


@pytest.fixture(autouse=True)
def _fresh():
    with fresh_kernel_state(K.set_layer_order):
        yield


def _graph(n=90, e=700, f=32, dtype=torch.float32, seed=0):
    return random_features_graph(n, e, f, dtype=dtype, seed=seed)


def _step(conv, x, edge_index):
    out = conv(x, edge_index)
    inputs = [x] + list(conv.parameters())
    # A fixed upstream gradient (not out.square().sum(), whose gradient through normalize=True's
    # unit rows is rounding noise).
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return out.detach(), torch.autograd.grad(out, inputs, g)


def _close(got, want, tol):
    for a, b in zip((got[0],) + tuple(got[1]), (want[0],) + tuple(want[1])):
        assert (a - b).abs().max() <= tol * b.abs().max(), (a - b).abs().max()


class _Widths:
    r"""Records the width of the rows each ``propagate`` call aggregates."""

    def __init__(self, conv):
        self.widths = []
        original = conv.propagate
        conv.propagate = self._wrap(original)
        self.conv, self.original = conv, original

    def _wrap(self, original):
        def propagate(edge_index, x, size=None, **kwargs):
            self.widths.append(x[0].size(-1))
            return original(edge_index, x=x, size=size, **kwargs)
        return propagate


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("aggr", ["mean", "add", "sum"])
@pytest.mark.parametrize("options", [{}, {"bias": False}, {"normalize": True}, {"project": True}])
def test_narrowing_layer_maps_first_and_equals_pyg(dtype, tol, aggr, options):
    torch.manual_seed(0)
    x, edge_index = _graph(dtype=dtype)
    x.requires_grad_()
    conv = SAGEConv(32, 8, aggr=aggr, **options).to(dtype)
    K.set_layer_order("pyg")
    with K.accelerate(conv, backend="auto"):
        want = _step(conv, x, edge_index)
    K.set_layer_order(None)
    with K.accelerate(conv, backend="auto"):
        widths = _Widths(conv)
        for _ in range(2):
            _close(_step(conv, x, edge_index), want, tol)
    assert widths.widths == [8, 8]  # the mapped rows were aggregated, not the 32-wide input


@pytest.mark.parametrize("case", ["max", "widening", "propagate_hook", "lin_l_hook", "autocast",
                                  "pyg_order"])
def test_pygs_order_where_mapping_first_could_differ_or_be_seen(case):
    x, edge_index = _graph()
    x.requires_grad_()
    conv = SAGEConv(32, 64 if case == "widening" else 8, aggr="max" if case == "max" else "mean")
    if case == "propagate_hook":
        conv.register_propagate_forward_hook(lambda m, a, out: None)
    if case == "lin_l_hook":
        conv.lin_l.register_forward_hook(lambda m, a, out: None)
    if case == "pyg_order":
        K.set_layer_order("pyg")
    with K.accelerate(conv, backend="auto"):
        widths = _Widths(conv)
        if case == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                conv(x, edge_index)
        else:
            conv(x, edge_index)
    assert widths.widths == [32]


def test_a_static_input_is_kept_rather_than_mapped_first():
    # The features (no gradient, the same tensor every step): mapped first once, then aggregated
    # as they are and kept, so later steps aggregate nothing.
    x, edge_index = _graph()
    conv = SAGEConv(32, 8)
    K.set_layer_order("pyg")
    with K.accelerate(conv, backend="auto"):
        want = conv(x, edge_index)
    K.set_layer_order(None)
    K.clear_memos()  # forget that call's input
    with K.accelerate(conv, backend="auto"):
        widths = _Widths(conv)
        for _ in range(4):
            torch.testing.assert_close(conv(x, edge_index), want, rtol=1e-5, atol=1e-6)
    assert widths.widths == [8, 32, 32, 32]
    assert kept.info()["kept"] == 1 and kept.info()["hits"] == 2
