"""The raw ``aggregate`` op against PyG's scatter: values and gradients, all backends."""
import pytest
import torch
from torch_geometric.utils import scatter

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import csr as csr_mod

from kernel_testutils import cpp_or_skip, make_graph

CASES = [
    dict(num_src=40, num_dst=40, num_edges=300),
    dict(num_src=40, num_dst=40, num_edges=300, skew=True),
    dict(num_src=50, num_dst=17, num_edges=200),  # rectangular (halo-extended sources)
    dict(num_src=9, num_dst=30, num_edges=60),    # more destinations than sources
]


def _reference(x, ei, w, reduce, n_dst):
    msg = x.index_select(0, ei[0])
    if w is not None:
        msg = msg * w.view(-1, 1)
    return scatter(msg, ei[1], 0, dim_size=n_dst, reduce=reduce)


def _check(backend, case, reduce, weighted, feat=19, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ei = make_graph(**case, seed=seed)
    x = torch.randn(case["num_src"], feat, dtype=dtype, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=dtype, requires_grad=True) + 0.5 if weighted else None
    if w is not None:
        w = w.detach().requires_grad_()
    ref = _reference(x, ei, w, reduce, case["num_dst"])
    out = K.aggregate(x, ei, w, reduce, case["num_dst"], backend=backend)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    inputs = (x, w) if weighted else (x,)
    got = torch.autograd.grad(out, inputs, g)
    exp = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_matches_pyg_scatter(backend, case, reduce, weighted):
    if backend == "cpp":
        cpp_or_skip()
    _check(backend, case, reduce, weighted)


@pytest.mark.parametrize("feat", [1, 5, 8, 33, 128, 200, 300])
def test_feature_widths_cpp(feat):
    cpp_or_skip()
    for reduce in ("sum", "mean", "max"):
        _check("cpp", CASES[0], reduce, True, feat=feat)


def test_float64_cpp():
    cpp_or_skip()
    _check("cpp", CASES[2], "sum", True, dtype=torch.float64)


def test_empty_graph_and_no_edges():
    x = torch.randn(5, 4, requires_grad=True)
    ei = torch.empty(2, 0, dtype=torch.long)
    for reduce in ("sum", "mean", "max"):
        out = K.aggregate(x, ei, None, reduce, 3)
        assert out.shape == (3, 4) and out.abs().sum() == 0
        out.sum().backward()


@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_no_source_rows(backend):
    # A single process's halo: no rows, no edges (the -1 of a reshape was ambiguous there).
    if backend == "cpp":
        cpp_or_skip()
    x = torch.randn(0, 7, requires_grad=True)
    ei = torch.empty(2, 0, dtype=torch.long)
    out = K.aggregate(x, ei, None, "sum", 3, backend=backend)
    assert out.shape == (3, 7) and out.abs().sum() == 0
    out.sum().backward()
    assert x.grad.shape == (0, 7)


def test_csr_cache_recognises_equal_content():
    K.clear_memos()
    ei = make_graph(40, 40, 300)
    a = csr_mod.get_csr(ei, 40, 40)
    b = csr_mod.get_csr(ei.clone(), 40, 40)  # new tensor, same content: no rebuild
    assert a is b and K.memo_info()["misses"] == 1
    c = csr_mod.get_csr(ei.flip(0), 40, 40)
    assert c is not a
    ei2 = ei.clone()
    csr_mod.get_csr(ei2, 40, 40)
    ei2[0, 0] = (ei2[0, 0] + 1) % 40  # in-place change bumps the version: rebuilt
    assert csr_mod.get_csr(ei2, 40, 40) is not a


def test_csr_cache_keeps_the_newest_equal_copy():
    # Layers that rebuild an equal edge_index per call (gcn_norm) must not keep the first
    # copy alive beside the newest one; a view is not kept (it would hold its whole base).
    import gc
    import weakref
    K.clear_memos()
    first = make_graph(40, 40, 300)
    csr = csr_mod.get_csr(first, 40, 40)
    gone = weakref.ref(first)
    second = first.clone()
    del first
    assert csr_mod.get_csr(second, 40, 40) is csr
    gc.collect()
    assert gone() is None
    wide = torch.cat([second, second], dim=1)
    assert csr_mod.get_csr(wide[:, :second.size(1)], 40, 40) is csr  # a view of a larger one
    kept = weakref.ref(second)
    del second
    gc.collect()
    assert kept() is not None and K.memo_info()["misses"] == 1


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_csr_built_in_inference_mode_serves_training(reduce):
    # An evaluation in inference mode first (Lightning's sanity check) used to leave inference
    # tensors in the cache: training then failed ("cannot be saved for backward").
    torch.manual_seed(0)
    x, ei = torch.randn(40, 8), make_graph(40, 40, 300)
    K.clear_memos()
    xg = x.clone().requires_grad_()
    want = K.aggregate(xg, ei, None, reduce, 40)
    want.square().sum().backward()
    K.clear_memos()
    with torch.inference_mode():
        inference_ei = ei.clone()
        K.aggregate(x, inference_ei, None, reduce, 40)
    xg2 = x.clone().requires_grad_()
    got = K.aggregate(xg2, ei, None, reduce, 40)
    got.square().sum().backward()
    assert K.memo_info()["misses"] == 1  # the inference-mode build served training
    assert torch.equal(got, want) and torch.equal(xg2.grad, xg.grad)
    with torch.inference_mode():
        inference_ei[0, 0] = (inference_ei[0, 0] + 1) % 40  # not counted: matched by content
        edited = scatter(x[inference_ei[0]], inference_ei[1], 0, dim_size=40, reduce=reduce)
        torch.testing.assert_close(K.aggregate(x, inference_ei, None, reduce, 40), edited)
    assert K.memo_info()["misses"] == 2


def test_fingerprint_positions_stay_in_range_beyond_2_24_edges():
    # 17M edges: a float32 linspace put the last sample at position 17,000,000 (IndexError).
    for e in (1, 2, 31, 33, 17_000_000, 2**25 + 1):
        ei = torch.zeros(2, 1, dtype=torch.long).expand(2, e)  # no memory: stride-0 view
        fp = csr_mod._fingerprint(ei)
        assert fp[1] == e and len(fp[2]) == 2 * min(csr_mod._SAMPLES, e)


def test_sorted_input_skips_argsort():
    ei = make_graph(40, 40, 300)
    ei = ei[:, torch.argsort(ei[1], stable=True)]
    assert csr_mod.build_csr(ei, 40, 40).perm is None


def test_edge_index_input():
    from torch_geometric import EdgeIndex

    ei = make_graph(40, 40, 300)
    x = torch.randn(40, 8)
    ref = _reference(x, ei, None, "sum", 40)
    e = EdgeIndex(ei, sparse_size=(40, 40)).sort_by("col")[0]
    torch.testing.assert_close(K.aggregate(x, e, None, "sum", 40), ref)


def test_trailing_dims_and_validation():
    ei = make_graph(40, 40, 300)
    x = torch.randn(40, 2, 3)
    out = K.aggregate(x, ei, None, "sum", 40)
    torch.testing.assert_close(out.view(40, 6), _reference(x.view(40, 6), ei, None, "sum", 40))
    with pytest.raises(ValueError):
        K.aggregate(x, ei, None, "median", 40)


def test_out_of_range_indices_raise():
    x = torch.randn(5, 3)
    with pytest.raises(IndexError):
        K.aggregate(x, torch.tensor([[0, 5], [1, 2]]), None, "sum", 5)
    with pytest.raises(IndexError):
        K.aggregate(x, torch.tensor([[0, 1], [1, 4]]), None, "sum", 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_take_values_cpp_equals_index_select(dtype, index_dtype):
    cpp_or_skip()
    mod = K.cpp.load()
    g = torch.Generator().manual_seed(0)
    values = torch.randn(300_001, generator=g, dtype=dtype)  # several parallel chunks, odd tail
    perm = torch.randperm(values.numel(), generator=g).to(index_dtype)
    assert torch.equal(mod.take_values(values, perm), values.index_select(0, perm))
    assert mod.take_values(values, perm[:0]).numel() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("feat", [128, 37, 3])  # full blocks, a narrower block + tail, tail only
def test_backward_reads_weights_through_the_transposed_positions(dtype, index_dtype, feat):
    # Backward's weights are the forward's read through t_perm inside the C++ kernel: bit for
    # bit what gathering them first (the former path, and every other backend's) gives.
    cpp_or_skip()
    from lightning_fullgraph.kernels import ops
    g = torch.Generator().manual_seed(0)
    n, e = 2_000, 40_000  # several row chunks and prefetch distances
    ei = torch.randint(0, n, (2, e), generator=g)
    csr = csr_mod.get_csr(ei, n, n)
    t_col, t_perm = csr.t_col.to(index_dtype), csr.t_perm.to(index_dtype)
    w = torch.rand(e, generator=g, dtype=torch.float64 if dtype == torch.float64
                   else torch.float32)
    grad = torch.randn(n, feat, generator=g).to(dtype)
    fused = ops.csr_sum_raw(csr.t_rowptr, t_col, w, grad, False, "cpp", t_perm)
    gathered = ops.csr_sum_raw(csr.t_rowptr, t_col, w.index_select(0, t_perm), grad, False,
                               "cpp")
    assert fused.dtype == gathered.dtype and torch.equal(fused, gathered)
    reference = ops.csr_sum_raw(csr.t_rowptr, t_col, w, grad, False, "torch", t_perm)
    torch.testing.assert_close(fused, reference, rtol=1e-5, atol=1e-4)
    mod = K.cpp.load()
    with pytest.raises(ValueError, match="weight_perm needs a weight and a sum"):
        mod.csr_sum(csr.t_rowptr, t_col, w, grad, True, False, t_perm)
    with pytest.raises(ValueError, match="col's dtype"):
        other = torch.int64 if index_dtype == torch.int32 else torch.int32
        mod.csr_sum(csr.t_rowptr, t_col, w, grad, False, False, t_perm.to(other))


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_permuted_edge_weights_gradient(backend):
    # Edge weights go to CSR order through permute_values (prefetching gather on "cpp"); the
    # gradient must come back to input order exactly as index_select's does.
    if backend == "cpp":
        cpp_or_skip()
    ei = make_graph(50, 40, 400, seed=3)
    x = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    out = K.aggregate(x, ei, w, "sum", 40, backend=backend)
    out.backward(torch.ones_like(out))
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = scatter(x_ref[ei[0]] * w_ref.unsqueeze(1), ei[1], dim=0, dim_size=40, reduce="sum")
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(w.grad, w_ref.grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
