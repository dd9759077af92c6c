"""``csr_row_read``: the C++ kernels' row gather without output (the benchmarks' floor under
``csr_sum``). Its per-thread sums must add up to every edge's source row, read exactly once per
edge, through every path of the kernels' task grid: feature blocks of every width, the tiles of
wide rows, feature groups for a hub row, both index dtypes and every row dtype."""
import pytest
import torch

import lightning_fullgraph.kernels as K

from kernel_testutils import cpp_or_skip, make_graph


def _mod():
    cpp_or_skip()
    from lightning_fullgraph.kernels import cpp

    return cpp.load()


def _expected(x, col):
    return x.double()[col.long()].sum(0)


@pytest.mark.parametrize("feat", [8, 16, 40, 128, 136, 256, 392])
@pytest.mark.parametrize("skew", [False, True])
def test_sums_are_every_edge_row_once(feat, skew):
    mod = _mod()
    ei = make_graph(300, 300, 4000, seed=feat, skew=skew)  # skew: a hub row -> feature groups
    csr = K.build_csr(ei, 300, 300)
    x = torch.randn(300, feat)
    sums = mod.csr_row_read(csr.rowptr, csr.col, x)
    assert sums.dtype == torch.float32 and sums.shape[1] == feat and sums.shape[0] >= torch.get_num_threads()
    torch.testing.assert_close(sums.double().sum(0), _expected(x, csr.col), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype, acc", [(torch.float64, torch.float64), (torch.bfloat16, torch.float32)])
def test_row_dtypes(dtype, acc):
    mod = _mod()
    ei = make_graph(64, 64, 900, seed=1)
    csr = K.build_csr(ei, 64, 64)
    x = torch.randn(64, 24).to(dtype)
    sums = mod.csr_row_read(csr.rowptr, csr.col, x)
    assert sums.dtype == acc
    tol = 1e-10 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(sums.double().sum(0), _expected(x, csr.col), rtol=tol, atol=tol)


def test_int64_columns_and_the_transposed_structure():
    mod = _mod()
    ei = make_graph(50, 17, 400, seed=2)  # rectangular: the transpose has 50 rows over 17 sources
    csr = K.build_csr(ei, 50, 17)
    g = torch.randn(17, 32)
    sums = mod.csr_row_read(csr.t_rowptr, csr.t_col.long(), g)
    torch.testing.assert_close(sums.double().sum(0), _expected(g, csr.t_col), rtol=1e-5, atol=1e-4)


def test_single_thread_and_empty_graph():
    mod = _mod()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ei = make_graph(40, 40, 300, seed=3)
        csr = K.build_csr(ei, 40, 40)
        x = torch.randn(40, 16)
        torch.testing.assert_close(mod.csr_row_read(csr.rowptr, csr.col, x).double().sum(0), _expected(x, csr.col),
                                   rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(threads)
    empty = mod.csr_row_read(torch.zeros(6, dtype=torch.long), torch.zeros(0, dtype=torch.int32), torch.randn(3, 8))
    assert torch.count_nonzero(empty) == 0


def test_refuses_what_it_cannot_read():
    mod = _mod()
    rowptr = torch.tensor([0, 2, 3], dtype=torch.long)
    col = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of 8"):
        mod.csr_row_read(rowptr, col, torch.randn(3, 12))
    with pytest.raises(IndexError, match=r"csr_row_read: invalid CSR: .*col\[2\] = 2"):
        mod.csr_row_read(rowptr, col, torch.randn(2, 8))
    with pytest.raises(ValueError, match="float32, float64 or bfloat16"):
        mod.csr_row_read(rowptr, col, torch.ones(3, 8, dtype=torch.int32))
