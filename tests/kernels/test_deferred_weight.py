"""``lin_l``'s weight gradient deferred past the halo gradients' transfer (kernels/deferred_weight.py):
the gradients are ``F.linear``'s, first and second order, and the weight's comes from the node
created first (so the autograd engine runs it last)."""
import pytest
import torch
import torch.nn.functional as F

from lightning_fullgraph.kernels.deferred_weight import DeferredWeightGrad


def _inputs(dtype=torch.float64, bias=True):
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=dtype, requires_grad=True)
    lin = torch.nn.Linear(5, 3, bias=bias).to(dtype)
    return x, lin


def _deferred(x, lin):
    deferred = DeferredWeightGrad(lin.weight)
    deferred.start()  # where a split aggregation starts it: before the halo's receive
    agg = x * 2.0  # the aggregation's output, made after
    return deferred.linear(agg, lin.bias), agg


@pytest.mark.parametrize("bias", [True, False])
def test_gradients_are_linears(bias):
    x, lin = _inputs(torch.float32, bias)
    target = torch.randn(7, 3)
    out, _ = _deferred(x, lin)
    ((out - target) ** 2).sum().backward()
    got = [x.grad.clone(), lin.weight.grad.clone()] + ([lin.bias.grad.clone()] if bias else [])
    x.grad = None
    lin.zero_grad()
    ((F.linear(x * 2.0, lin.weight, lin.bias) - target) ** 2).sum().backward()
    want = [x.grad, lin.weight.grad] + ([lin.bias.grad] if bias else [])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])  # the same products
    if bias:
        torch.testing.assert_close(got[2], want[2])


def test_the_weight_gradient_runs_last():
    # Nodes created later run first: the weight's node, made before the aggregation's, runs
    # after everything the aggregation's backward leads to (there, the halo's transfer).
    x, lin = _inputs()
    order = []
    deferred = DeferredWeightGrad(lin.weight)
    deferred.start()
    agg = x * 2.0
    agg.register_hook(lambda g: order.append("input"))
    lin.weight.register_hook(lambda g: order.append("weight"))
    deferred.linear(agg, lin.bias).sum().backward()
    assert order == ["input", "weight"]


def test_second_order_and_retained_graphs():
    x, lin = _inputs()
    out, agg = _deferred(x, lin)
    # A gradient penalty: differentiate the input's gradient again.
    (grad_x, ) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    grad_x.pow(2).sum().backward()
    got = (x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone())
    x.grad = None
    lin.zero_grad()
    ref = F.linear(x * 2.0, lin.weight, lin.bias)
    (grad_x, ) = torch.autograd.grad(ref.pow(2).sum(), x, create_graph=True)
    grad_x.pow(2).sum().backward()
    for a, b in zip(got, (x.grad, lin.weight.grad, lin.bias.grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # Twice through a retained graph: the weight's gradient accumulates twice.
    lin.zero_grad()
    out, _ = _deferred(x, lin)
    loss = out.sum()
    loss.backward(retain_graph=True)
    once = lin.weight.grad.clone()
    loss.backward()
    torch.testing.assert_close(lin.weight.grad, 2 * once)
    # Only the input's gradient asked for: the weight's node does not run.
    out, _ = _deferred(x, lin)
    (only, ) = torch.autograd.grad(out.sum(), x)
    torch.testing.assert_close(only, 2.0 * lin.weight.sum(0).expand(7, 5))


def test_what_it_does_not_map_is_left_to_the_layer():
    x, lin = _inputs(torch.float64)
    deferred = DeferredWeightGrad(lin.weight)
    assert deferred.linear(x, lin.bias) is None and not deferred.started  # not started
    deferred.start()
    assert deferred.linear(x.float(), lin.bias) is None  # another dtype
    assert deferred.linear(x[:, :4], lin.bias) is None  # another width
    out = deferred.linear(x, lin.bias)
    out.relu_()  # a fresh tensor: an in-place activation after it is fine
    out.sum().backward()
    assert lin.weight.grad is not None
