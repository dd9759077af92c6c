"""Triton kernels: correctness under TRITON_INTERPRET=1 on CPU (small graphs), GPU when present."""
import os

import pytest
import torch
import torch_geometric.nn as gnn

import lightning_fullgraph.kernels as K
from kernel_testutils import make_graph, skip_or_fail

try:
    import triton  # noqa: F401
except ImportError as exc:
    skip_or_fail(f"triton is not installed ({exc}); pip install 'lightning-fullgraph[triton]'",
                 allow_module_level=True)

interpreted = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton_device = pytest.mark.skipif(not (torch.cuda.is_available() or interpreted),
                                         reason="needs a CUDA GPU or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@needs_triton_device
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(24, 24, 90), (30, 11, 70)])
def test_triton_matches_reference(reduce, weighted, shape):
    torch.manual_seed(0)
    n_src, n_dst, e = shape
    ei = make_graph(n_src, n_dst, e, skew=True).to(DEVICE)
    x = torch.randn(n_src, 20, device=DEVICE, requires_grad=True)
    w = (torch.rand(ei.size(1), device=DEVICE) + 0.5).requires_grad_() if weighted else None
    ref = K.aggregate(x, ei, w, reduce, n_dst, backend="torch")
    out = K.aggregate(x, ei, w, reduce, n_dst, backend="triton")
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    leaves = [x] + ([w] if weighted else [])
    for a, b in zip(torch.autograd.grad(out, leaves, g), torch.autograd.grad(ref, leaves, g)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_triton_device
def test_triton_backend_in_layer():
    torch.manual_seed(0)
    layer = gnn.GCNConv(8, 4).to(DEVICE)
    ei = make_graph(24, 24, 90).to(DEVICE)
    x = torch.randn(24, 8, device=DEVICE)
    ref = layer(x, ei)
    with K.accelerate(layer, backend="triton"):
        torch.testing.assert_close(layer(x, ei), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_auto_picks_triton_on_gpu():
    assert K.resolve("auto", torch.device("cuda")) == "triton"
