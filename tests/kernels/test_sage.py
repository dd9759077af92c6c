"""SAGEConv's root term accumulated into lin_l's product (``kernels.sage``): PyG's results,
and PyG's own forward wherever the fused one could differ."""
from unittest import mock

import pytest
import torch
from torch_geometric.nn import SAGEConv
from torch_geometric.nn.dense.linear import Linear

import lightning_fullgraph.kernels as K


@pytest.fixture(autouse=True)
def _pyg_order():
    # The fusion in PyG's order (lin_l called as a module); narrowing layers mapping first:
    # tests/kernels/test_sage_reorder.py.
    K.set_layer_order("pyg")
    yield
    K.set_layer_order(None)


def _graph(n=60, e=400, f=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g, dtype=dtype), torch.randint(0, n, (2, e), generator=g)


def _run(conv, x, edge_index):
    x = x.detach().requires_grad_()
    out = conv(x, edge_index)
    params = [p for p in conv.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.square().sum(), [x] + params)
    return out.detach(), grads


def _linear_calls(conv, x, edge_index):
    with mock.patch.object(Linear, "forward", autospec=True,
                           side_effect=lambda self, t: torch.nn.functional.linear(
                               t, self.weight, self.bias)) as spy:
        result = _run(conv, x, edge_index)
    return spy.call_count, result


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("options", [{}, {"normalize": True}, {"project": True},
                                     {"aggr": "max"}])
def test_fused_forward_equals_pyg(dtype, tol, options):
    torch.manual_seed(0)
    conv = SAGEConv(16, 8, **options).to(dtype)
    x, ei = _graph(dtype=dtype)
    want = _run(conv, x, ei)
    with K.use("auto"):
        conv(x, ei)  # installed by the first call, fused from the second
        assert "forward" in conv.__dict__
        calls, got = _linear_calls(conv, x, ei)
    assert "forward" not in conv.__dict__  # reverted with the kernels
    assert calls == 1 + bool(options.get("project"))  # lin_r is not called: it accumulates
    torch.testing.assert_close(got[0], want[0], rtol=tol, atol=tol)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_bipartite_input_and_accelerate_handle():
    torch.manual_seed(0)
    conv = SAGEConv((16, 12), 8)
    x_src, ei = _graph(n=60)
    x_dst = torch.randn(30, 12)
    ei = ei[:, ei[1] < 30]
    want = conv((x_src, x_dst), ei)
    handle = K.accelerate(conv, backend="torch")
    assert "forward" in conv.__dict__  # installed at once by accelerate()
    torch.testing.assert_close(conv((x_src, x_dst), ei), want)
    handle.revert()
    assert "forward" not in conv.__dict__


def test_pyg_forward_wherever_fusing_could_differ():
    torch.manual_seed(0)
    x, ei = _graph()
    # No root term: nothing to fuse, nothing installed.
    conv = SAGEConv(16, 8, root_weight=False)
    with K.use("auto"):
        conv(x, ei)
        assert "forward" not in conv.__dict__
    # A hook on lin_r must see it called.
    conv = SAGEConv(16, 8)
    want = _run(conv, x, ei)
    seen = []
    conv.lin_r.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    with K.use("auto"):
        conv(x, ei)
        seen.clear()
        calls, got = _linear_calls(conv, x, ei)
    assert calls == 2 and seen == [torch.Size([60, 8])]
    torch.testing.assert_close(got[0], want[0])
    # Autocast casts each product itself: PyG's forward, the same bits as without kernels'
    # fusion (the aggregation is the kernels' in both).
    conv = SAGEConv(16, 8)
    with K.use("auto"):
        conv(x, ei)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            calls, got = _linear_calls(conv, x, ei)
            del conv.__dict__["forward"]  # PyG's own forward on the same kernels
            want = _run(conv, x, ei)
    assert calls == 2 and got[0].dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_a_hook_that_keeps_lin_l_output_sees_it_unchanged():
    torch.manual_seed(0)
    conv = SAGEConv(16, 8)
    x, ei = _graph()
    kept = []
    conv.lin_l.register_forward_hook(lambda m, i, o: kept.append((o, o.clone())))
    with K.use("auto"):
        conv(x, ei)
        kept.clear()
        out = conv(x, ei)
    (held, copy), = kept
    assert torch.equal(held, copy) and not torch.equal(out, held)  # accumulated elsewhere


def test_lazy_layer_is_fused_once_materialized():
    torch.manual_seed(0)
    conv = SAGEConv(-1, 8)
    x, ei = _graph()
    with K.use("auto"):
        first = conv(x, ei)  # materializes lin_l / lin_r (their pre-hooks): PyG's forward
        calls, (second, _) = _linear_calls(conv, x, ei)
    assert calls == 1
    torch.testing.assert_close(second, first.detach())
