"""bfloat16 rows (mixed precision): PyG's output dtype, float32 sums, every backend.

Under ``torch.autocast("cpu", dtype=torch.bfloat16)`` a ``GCNConv`` aggregates the bfloat16
output of its linear layer with float32 edge weights; PyG's message ``weight * x_j`` is then
float32.  The kernels give the same dtype, sum in float32 whatever the output dtype (a hub
row does not lose precision edge by edge), and the C++ kernels read the bfloat16 rows
themselves (half the bytes of float32 rows) instead of falling back to the reference.
"""
import os

import pytest
import torch
import torch_geometric.nn as gnn
from torch_geometric.utils import scatter

import lightning_fullgraph.kernels as K

from kernel_testutils import cpp_or_skip, make_graph, skip_or_fail

BACKENDS = ["cpp", "torch", "triton"]


def _backend_or_skip(backend):
    if backend == "cpp":
        cpp_or_skip()
    if backend == "triton":
        try:
            import triton  # noqa: F401
        except ImportError as exc:  # CI installs it: there a missing triton fails
            skip_or_fail(f"triton is not installed ({exc}); "
                         "pip install 'lightning-fullgraph[triton]'")
        if not (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"):
            pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1")


def _pyg(x, ei, w, reduce, n_dst):
    msg = x.index_select(0, ei[0])
    if w is not None:
        msg = w.view(-1, 1) * msg
    return scatter(msg, ei[1], 0, dim_size=n_dst, reduce=reduce)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32, torch.bfloat16])
def test_bfloat16_rows_give_pygs_dtype_and_float32_accuracy(backend, reduce, weight_dtype):
    _backend_or_skip(backend)
    torch.manual_seed(0)
    ei = make_graph(60, 40, 600, skew=True)
    x = torch.randn(60, 37).to(torch.bfloat16).requires_grad_()
    w = None if weight_dtype is None else \
        (torch.rand(ei.size(1)) + 0.5).to(weight_dtype).requires_grad_()
    out = K.aggregate(x, ei, w, reduce, 40, backend=backend)
    ref = _pyg(x, ei, w, reduce, 40)
    assert out.dtype == ref.dtype  # float32 when the weights are, else bfloat16
    # Against the exact result (float64 of the same bfloat16 inputs): within the output
    # dtype's rounding of each value, i.e. no error accumulated along a row's edges.
    exact = _pyg(x.double(), ei, None if w is None else w.double(), reduce, 40)
    bf16 = out.dtype == torch.bfloat16
    rtol = 2.0 ** -8 if bf16 else 1e-5
    if backend == "triton" and not torch.cuda.is_available() and bf16:
        rtol = 2.0 ** -7  # the interpreter truncates float32 -> bfloat16 (GPUs round to nearest)
    torch.testing.assert_close(out.double(), exact, rtol=rtol, atol=1e-5)

    if reduce == "max" and w is not None and w.dtype == torch.bfloat16:
        return  # bfloat16 products, as PyG's: rounded products tie where float32 ones do not
    # Gradients: those of the float32 path on the same (exactly representable) values,
    # rounded to each leaf's dtype (max breaks ties the same way in both).
    g = torch.randn(out.shape).to(out.dtype)
    leaves = [x] + ([w] if w is not None else [])
    got = torch.autograd.grad(out, leaves, g)
    x32 = x.detach().float().requires_grad_()
    w32 = None if w is None else w.detach().float().requires_grad_()
    out32 = K.aggregate(x32, ei, w32, reduce, 40, backend=backend)
    want = torch.autograd.grad(out32, [x32] + ([w32] if w is not None else []), g.float())
    for a, b, leaf in zip(got, want, leaves):
        assert a.dtype == leaf.dtype and a.shape == leaf.shape
        tol = 2.0 ** -7 if a.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hub_row_of_bfloat16_ones_sums_exactly(backend):
    # 1000 edges of 1.0 into one row: summed in bfloat16 the row stops growing at 256
    # (256 + 1 rounds back to 256); summed in float32 and rounded once it is 1000 exactly.
    _backend_or_skip(backend)
    n = 1000
    ei = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)])
    x = torch.ones(n, 16, dtype=torch.bfloat16)
    out = K.aggregate(x, ei, None, "sum", 2, backend=backend)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[0], torch.full((16,), 1000.0, dtype=torch.bfloat16))
    assert torch.equal(out[1], torch.zeros(16, dtype=torch.bfloat16))
    mean = K.aggregate(x, ei, None, "mean", 2, backend=backend)
    assert torch.equal(mean[0], torch.ones(16, dtype=torch.bfloat16))


def test_cpp_rounds_bfloat16_outputs_like_torch():
    # Rows whose float32 sum is exact (two bfloat16 values of nearby exponents): the stored
    # bfloat16 must be torch's round-to-nearest-even of it, bit for bit, ties included; NaN
    # and infinities pass through.
    cpp_or_skip()
    g = torch.Generator().manual_seed(3)
    n = 4096
    a = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    b = (torch.randn(n, 64, generator=g) * 0.75).to(torch.bfloat16)
    a[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0])
    x = torch.cat([a, b])
    ei = torch.stack([torch.cat([torch.arange(n), torch.arange(n) + n]),
                      torch.cat([torch.arange(n), torch.arange(n)])])
    out = K.aggregate(x, ei, None, "sum", n, backend="cpp")
    want = (a.float() + b.float()).to(torch.bfloat16)
    nan = want.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out.view(torch.int16)[~nan], want.view(torch.int16)[~nan])


@pytest.mark.parametrize("cls", [gnn.GCNConv, gnn.SAGEConv, gnn.GraphConv, gnn.GINConv])
def test_layers_under_autocast_match_pyg(cls):
    # Unmodified layers under CPU autocast: same output dtype as PyG, values as close to
    # the float64 layer as PyG's, gradients of every parameter in their dtype.
    cpp_or_skip()
    torch.manual_seed(0)
    ei = make_graph(80, 80, 900, skew=True)
    x = torch.randn(80, 24)

    def make():
        torch.manual_seed(1)
        if cls is gnn.GINConv:
            return cls(torch.nn.Linear(24, 16))
        return cls(24, 16)

    ref, ours = make(), make()
    handle = K.accelerate(ours, backend="cpp")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(x, ei), ours(x, ei)
    exact = make().double()(x.double(), ei)
    assert a.dtype == b.dtype
    err_pyg = (a.double() - exact).abs().max().item()
    err_ours = (b.double() - exact).abs().max().item()
    assert err_ours <= 1.5 * err_pyg + 1e-6
    b.float().sum().backward()
    a.float().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert p.grad is not None and p.grad.dtype == p.dtype, name
        scale = q.grad.abs().max().item() + 1.0
        assert (p.grad - q.grad).abs().max().item() <= 0.05 * scale, name
    handle.revert()
