"""Hand-built CSR at the op boundary: every invariant the kernels rely on is checked, on every backend.

The C++ kernels (``csrc/aggregate.cpp``) and the Triton kernels index ``x[col[e]]`` for
``e`` in ``[rowptr[r], rowptr[r + 1])`` without bounds checks; a malformed CSR must raise a
clear error (``ValueError`` for the structure, ``IndexError`` for a column out of range)
before any kernel runs, including the transposed CSR used by backward, and the cache of
already-validated tensors must never skip a tensor that changed.
"""
import gc

import numpy as np
import pytest
import torch

from lightning_fullgraph.kernels import ops

from kernel_testutils import cpp_or_skip

BACKENDS = ["cpp", "torch", "triton"]
OPS = ["sum", "mean", "max", "edge_dot"]

# A valid hand-built CSR: 4 destination rows (row 1 empty), 5 source rows (source 5 would be
# out of range), one duplicate edge (2 <- 4 twice).
N_DST, N_SRC, F = 4, 5, 6
ROWPTR = [0, 2, 2, 5, 6]
COL = [1, 3, 0, 4, 4, 2]
NNZ = len(COL)


def _setup(backend):
    if backend == "cpp":
        cpp_or_skip()
    if backend == "triton":
        pytest.importorskip("triton")
        # the triton backend must really run the Triton kernels (interpreted on CPU), not the fallback
        assert ops._kernel_ok("triton", torch.zeros(1, 1)) == "triton", "needs CUDA or TRITON_INTERPRET=1"


def _valid(col_dtype=torch.int32):
    return torch.tensor(ROWPTR), torch.tensor(COL, dtype=col_dtype)


def _run(op, backend, rowptr, col, x, weight=None, a=None):
    """Call one op through its ``torch.ops`` custom op."""
    if op == "max":
        return ops.csr_max(rowptr, col, weight, x, backend)[0]
    if op == "edge_dot":
        if a is None:
            a = torch.randn(max(0, rowptr.numel() - 1), x.size(1))
        return ops.csr_edge_dot(rowptr, col, a, x, backend)
    return ops.csr_sum_raw(rowptr, col, weight, x, op == "mean", backend)


def _x(rows=N_SRC, f=F, **kw):
    return torch.randn(rows, f, **kw)


# name -> (rowptr, col, x rows, weight length or None, expected exception, message regex)
BAD = {
    "non_monotonic": ([0, 3, 2, 5, 6], COL, N_SRC, None, ValueError,
                      r"rowptr must be non-decreasing; first violation at rowptr\[1\] = 3 > rowptr\[2\] = 2"),
    "rowptr0_nonzero": ([1, 2, 2, 5, 6], COL, N_SRC, None, ValueError, r"rowptr\[0\] must be 0, got 1"),
    "rowptr_last_short": ([0, 2, 2, 5, 5], COL, N_SRC, None, ValueError,
                          r"rowptr\[-1\] = rowptr\[4\] must equal nnz = col.numel\(\) = 6, got 5"),
    "rowptr_last_long": ([0, 2, 2, 5, 7], COL, N_SRC, None, ValueError,
                         r"rowptr\[-1\] = rowptr\[4\] must equal nnz = col.numel\(\) = 6, got 7"),
    "rowptr_empty": ([], COL, N_SRC, None, ValueError, r"rowptr must have N_dst \+ 1 >= 1 entries"),
    "negative_col": (ROWPTR, [1, 3, 0, -1, 4, 2], N_SRC, None, IndexError,
                     r"col entries must lie in \[0, N_src\) = \[0, 5\).*first offending position col\[3\] = -1"),
    "too_large_col": (ROWPTR, [1, 3, 0, 4, 5, 2], N_SRC, None, IndexError,
                      r"col entries must lie in \[0, N_src\) = \[0, 5\).*first offending position col\[4\] = 5"),
    "huge_col": (ROWPTR, [1, 3, 0, 4, 2**31 - 1, 2], N_SRC, None, IndexError,
                 r"first offending position col\[4\] = 2147483647"),
    "x_too_few_rows": (ROWPTR, COL, 4, None, IndexError,
                       r"col entries must lie in \[0, N_src\) = \[0, 4\).*first offending position col\[3\] = 4"),
    "weight_short": (ROWPTR, COL, N_SRC, NNZ - 1, ValueError,
                     r"weight must have one entry per edge: nnz = col.numel\(\) = 6, got weight.numel\(\) = 5"),
    "weight_long": (ROWPTR, COL, N_SRC, NNZ + 3, ValueError, r"weight must have one entry per edge"),
}


# edge_dot takes no weight (its own shape checks: test_edge_dot_bad_a)
OP_CASES = [(op, case) for op in OPS for case in BAD if not (op == "edge_dot" and BAD[case][3] is not None)]


@pytest.mark.parametrize("col_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("op,case", OP_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_csr_raises(backend, op, case, col_dtype):
    _setup(backend)
    rp, col, rows, wlen, exc, msg = BAD[case]
    rowptr, col = torch.tensor(rp, dtype=torch.long), torch.tensor(col, dtype=col_dtype)
    weight = torch.rand(wlen) if wlen is not None else None
    with pytest.raises(exc, match=msg) as info:
        _run(op, backend, rowptr, col, _x(rows), weight)
    # the message names the op
    assert ("csr_edge_dot" if op == "edge_dot" else "csr_max" if op == "max" else "csr_sum") in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_edge_dot_bad_a(backend):
    _setup(backend)
    rowptr, col = _valid()
    with pytest.raises(ValueError, match=r"a must be \[N_dst, F\] = \[rowptr.numel\(\) - 1, b.size\(1\)\] = \[4, 6\]"):
        ops.csr_edge_dot(rowptr, col, torch.randn(N_DST - 1, F), _x(), backend)  # a has too few rows
    with pytest.raises(ValueError, match=r"= \[4, 6\], got \[4, 5\]"):
        ops.csr_edge_dot(rowptr, col, torch.randn(N_DST, F - 1), _x(), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_index_dtypes_and_dims(backend):
    _setup(backend)
    rowptr, col = _valid()
    with pytest.raises(ValueError, match="rowptr must be int64"):
        _run("sum", backend, rowptr.int(), col, _x())
    with pytest.raises(ValueError, match="col must be int32 or int64"):
        _run("sum", backend, rowptr, col.float(), _x())
    with pytest.raises(ValueError, match="rowptr and col must be 1-D"):
        _run("max", backend, rowptr, col.view(2, 3), _x())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_first_violation_in_large_csr(backend, op):
    # Large enough for the parallel (OpenMP) reductions; two violations: the first is named.
    _setup(backend)
    n, per_row = 100_000, 3
    rowptr = torch.arange(0, (n + 1) * per_row, per_row, dtype=torch.long)
    col = torch.randint(0, 1000, (n * per_row,), dtype=torch.int32)
    x = _x(1000, 4)
    bad_rp = rowptr.clone()
    bad_rp[70_001] = bad_rp[70_002] + 1
    bad_rp[90_001] = bad_rp[90_002] + 1
    with pytest.raises(ValueError, match=r"first violation at rowptr\[70001\] = 210007 > rowptr\[70002\] = 210006"):
        _run(op, backend, bad_rp, col, x)
    bad_col = col.clone()
    bad_col[123_456] = 1000
    bad_col[200_000] = -7
    with pytest.raises(IndexError, match=r"first offending position col\[123456\] = 1000 \(col min -7, max 1000\)"):
        _run(op, backend, rowptr, bad_col, x)


def _dense(weight=None):
    a = torch.zeros(N_DST, N_SRC, dtype=torch.float64)
    w = weight if weight is not None else torch.ones(NNZ, dtype=torch.float64)
    for r in range(N_DST):
        for e in range(ROWPTR[r], ROWPTR[r + 1]):
            a[r, COL[e]] += w[e]
    return a


def _expected(op, x, weight):
    x64 = x.double()
    w = weight.double() if weight is not None else torch.ones(NNZ, dtype=torch.float64)
    if op in ("sum", "mean"):
        out = _dense(w) @ x64
        if op == "mean":
            deg = torch.tensor([max(1, ROWPTR[r + 1] - ROWPTR[r]) for r in range(N_DST)], dtype=torch.float64)
            out = out / deg[:, None]
        return out
    out = torch.zeros(N_DST, x.size(1), dtype=torch.float64)
    for r in range(N_DST):
        msgs = [w[e] * x64[COL[e]] for e in range(ROWPTR[r], ROWPTR[r + 1])]
        if msgs:
            out[r] = torch.stack(msgs).amax(0)
    return out


@pytest.mark.parametrize("col_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_hand_built_csr_matches_reference(backend, op, weighted, col_dtype):
    _setup(backend)
    torch.manual_seed(0)
    rowptr, col = _valid(col_dtype)
    x = _x()
    weight = torch.rand(NNZ) + 0.5 if weighted else None
    out = _run(op, backend, rowptr, col, x, weight)
    torch.testing.assert_close(out.double(), _expected(op, x, weight), rtol=1e-5, atol=1e-5)
    # the same call twice (second one served by the validation cache) gives the same result
    torch.testing.assert_close(_run(op, backend, rowptr, col, x, weight), out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_valid_hand_built_edge_dot_and_backward(backend):
    _setup(backend)
    torch.manual_seed(0)
    rowptr, col = _valid()
    a, b = torch.randn(N_DST, F), _x()
    exp = torch.tensor([float(a[r] @ b[COL[e]]) for r in range(N_DST) for e in range(ROWPTR[r], ROWPTR[r + 1])])
    torch.testing.assert_close(ops.csr_edge_dot(rowptr, col, a, b, backend), exp, rtol=1e-5, atol=1e-5)
    # gradients through a valid hand-built transposed CSR
    t_rowptr, t_col, t_perm = _transpose()
    x = b.clone().requires_grad_()
    w = (torch.rand(NNZ) + 0.5).requires_grad_()
    out = ops.csr_sum(rowptr, col, w, x, False, t_rowptr, t_col, t_perm, backend)
    g = torch.randn_like(out)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    dense_w = _dense(w.detach().double())
    torch.testing.assert_close(gx.double(), dense_w.T @ g.double(), rtol=1e-5, atol=1e-5)
    exp_gw = torch.tensor([float(g[r] @ b[COL[e]]) for r in range(N_DST) for e in range(ROWPTR[r], ROWPTR[r + 1])])
    torch.testing.assert_close(gw, exp_gw, rtol=1e-5, atol=1e-5)


def _transpose():
    """Transposed CSR of the valid graph: rows = sources, columns = destinations."""
    row = torch.repeat_interleave(torch.arange(N_DST), torch.tensor(ROWPTR).diff())
    col = torch.tensor(COL)
    t_perm = torch.argsort(col, stable=True)
    t_col = row[t_perm].to(torch.int32)
    t_rowptr = torch.zeros(N_SRC + 1, dtype=torch.long)
    t_rowptr[1:] = torch.cumsum(torch.bincount(col, minlength=N_SRC), 0)
    return t_rowptr, t_col, t_perm


def _sum_backward(backend, t_rowptr, t_col, t_perm, weighted=False):
    rowptr, col = _valid()
    x = _x().requires_grad_()
    w = (torch.rand(NNZ) + 0.5).requires_grad_() if weighted else None
    out = ops.csr_sum(rowptr, col, w, x, False, t_rowptr, t_col, t_perm, backend)
    out.sum().backward()
    return x.grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_transposed_csr_raises_in_backward(backend):
    _setup(backend)
    t_rowptr, t_col, t_perm = _transpose()
    _sum_backward(backend, t_rowptr, t_col, t_perm, weighted=True)  # valid: no error
    bad = t_rowptr.clone()
    bad[2] = bad[3] + 1
    with pytest.raises(ValueError, match=r"csr_sum backward: the transposed CSR .* is invalid: .*non-decreasing"):
        _sum_backward(backend, bad, t_col, t_perm)
    bad = t_rowptr.clone()
    bad[-1] = NNZ - 1
    with pytest.raises(ValueError, match=r"transposed CSR .* is invalid: .*must equal nnz"):
        _sum_backward(backend, bad, t_col, t_perm)
    bad_col = t_col.clone()
    bad_col[1] = N_DST  # destinations lie in [0, N_dst)
    with pytest.raises(IndexError, match=r"transposed CSR .*N_dst = 4.* is invalid: .*col\[1\] = 4"):
        _sum_backward(backend, t_rowptr, bad_col, t_perm)
    bad_perm = t_perm.clone()
    bad_perm[2] = NNZ
    with pytest.raises(IndexError, match=r"t_perm entries must lie in \[0, 6\).*t_perm\[2\] = 6"):
        _sum_backward(backend, t_rowptr, t_col, bad_perm, weighted=True)
    # wrong shapes are caught by the forward already
    with pytest.raises(ValueError, match=r"t_rowptr must be 1-D with N_src \+ 1 = 6 entries"):
        _sum_backward(backend, t_rowptr[:-1], t_col, t_perm)
    with pytest.raises(ValueError, match=r"t_col and t_perm must have nnz = col.numel\(\) = 6 entries"):
        _sum_backward(backend, t_rowptr, t_col[:-1], t_perm)


# --------------------------------------------------------------------------- validation cache
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_in_place_change_after_validation_is_caught(backend, op):
    _setup(backend)
    x = _x()
    rowptr, col = _valid()
    _run(op, backend, rowptr, col, x)  # validated (and remembered)
    _run(op, backend, rowptr, col, x)
    col[4] = N_SRC
    with pytest.raises(IndexError, match=r"col\[4\] = 5"):
        _run(op, backend, rowptr, col, x)
    col[4] = 4
    _run(op, backend, rowptr, col, x)
    col[2:].fill_(-1)  # through a view: views share the version counter
    with pytest.raises(IndexError, match=r"col\[2\] = -1"):
        _run(op, backend, rowptr, col, x)
    col.copy_(torch.tensor(COL, dtype=col.dtype))
    _run(op, backend, rowptr, col, x)
    with torch.no_grad():
        rowptr[1] = 3
    with pytest.raises(ValueError, match="non-decreasing"):
        _run(op, backend, rowptr, col, x)
    rowptr[1] = 2
    _run(op, backend, rowptr, col, x)
    # the same CSR with fewer source rows
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        _run(op, backend, rowptr, col, _x(4))


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_tensor_at_the_same_address_is_validated(backend):
    # A validated tensor dies and a new one with the same address, numel and version (0) but
    # other content appears: keys of data_ptr/numel/version alone would skip validating it.
    _setup(backend)
    x = _x()
    rowptr = torch.tensor(ROWPTR)
    buf = np.array(COL, dtype=np.int32)
    col = torch.from_numpy(buf)
    _run("sum", backend, rowptr, col, x)
    ptr = col.data_ptr()
    del col
    gc.collect()
    buf[3] = 1 << 30  # not a tensor write: no version counter involved
    col2 = torch.from_numpy(buf)
    assert col2.data_ptr() == ptr and col2._version == 0
    with pytest.raises(IndexError, match=r"col\[3\] = 1073741824"):
        _run("sum", backend, rowptr, col2, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_tensors_are_always_validated(backend):
    _setup(backend)
    with torch.inference_mode():
        x = _x()
        rowptr, col = _valid()
        _run("sum", backend, rowptr, col, x)
        _run("max", backend, rowptr, col, x)
        col[0] = N_SRC  # inference tensors have no version counter
        with pytest.raises(IndexError, match=r"col\[0\] = 5"):
            _run("sum", backend, rowptr, col, x)
        with pytest.raises(IndexError, match=r"col\[0\] = 5"):
            _run("max", backend, rowptr, col, x)


def test_cache_is_used_and_can_be_disabled():
    cpp_or_skip()
    from lightning_fullgraph.kernels import cpp, validate

    mod = cpp.load()
    x = _x()
    rowptr, col = _valid()
    hits0, misses0 = mod.validation_cache_info()[:2]
    for _ in range(3):
        mod.csr_sum(rowptr, col, None, x, False)
    hits1, misses1 = mod.validation_cache_info()[:2]
    assert (hits1 - hits0, misses1 - misses0) == (2, 1)
    try:
        mod.set_validation_cache_size(0)
        mod.csr_sum(rowptr, col, None, x, False)
        assert mod.validation_cache_info()[:3] == [hits1, misses1, 0]  # not even looked up
    finally:
        mod.set_validation_cache_size(8)
    # through the torch.ops custom op (the dispatcher passes the same tensors): a hit too
    ops.csr_sum_raw(rowptr, col, None, x, False, "cpp")
    hits2 = mod.validation_cache_info()[0]
    ops.csr_sum_raw(rowptr, col, None, x, False, "cpp")
    assert mod.validation_cache_info()[0] == hits2 + 1
    validate.clear_memo()
    ops.csr_sum_raw(rowptr, col, None, x, False, "torch")
    ops.csr_sum_raw(rowptr, col, None, x, False, "torch")
    assert validate.memo_info()["hits"] == 1 and validate.memo_info()["misses"] == 1


def test_extension_module_validates_directly():
    # Not only the torch.ops path: the extension's functions check their inputs themselves.
    cpp_or_skip()
    from lightning_fullgraph.kernels import cpp

    mod = cpp.load()
    rowptr, col = _valid()
    bad = col.clone()
    bad[5] = 99
    with pytest.raises(IndexError, match=r"csr_sum: invalid CSR: .*col\[5\] = 99"):
        mod.csr_sum(rowptr, bad, None, _x(), True)
    with pytest.raises(IndexError, match=r"csr_max: invalid CSR: .*col\[5\] = 99"):
        mod.csr_max(rowptr, bad, None, _x())
    with pytest.raises(IndexError, match=r"csr_edge_dot: invalid CSR: .*col\[5\] = 99"):
        mod.csr_edge_dot(rowptr, bad, torch.randn(N_DST, F), _x())
    with pytest.raises(ValueError, match=r"check_csr: invalid CSR: rowptr\[0\] must be 0"):
        mod.check_csr(rowptr + 1, col, N_SRC)
    assert mod.check_csr(rowptr, col, N_SRC) == 3  # largest row length


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_validation_under_torch_compile(backend):
    # The checks run inside the opaque custom ops, on real tensors, also when autograd's
    # backward is traced by torch.compile (no data access on fake tensors).
    _setup(backend)
    torch.manual_seed(0)
    rowptr, col = _valid()
    t_rowptr, t_col, t_perm = _transpose()

    def loss(x, w, col, t_perm):
        return ops.csr_sum(rowptr, col, w, x, True, t_rowptr, t_col, t_perm, backend).square().sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    x = _x().requires_grad_()
    w = (torch.rand(NNZ) + 0.5).requires_grad_()
    got = torch.autograd.grad(compiled(x, w, col, t_perm), (x, w))
    exp = torch.autograd.grad(loss(x, w, col, t_perm), (x, w))
    for a, b in zip(got, exp):
        torch.testing.assert_close(a, b)
    bad_perm = t_perm.clone()
    bad_perm[0] = -1
    with pytest.raises(IndexError, match=r"t_perm\[0\] = -1"):
        torch.autograd.grad(compiled(x, w, col, bad_perm), (x, w))
    bad_col = col.clone()
    bad_col[5] = N_SRC
    with pytest.raises(IndexError, match=r"col\[5\] = 5"):
        compiled(x, w, bad_col, t_perm)
