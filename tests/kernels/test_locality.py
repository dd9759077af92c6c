"""Node order for locality (kernels/locality.py): chosen from the graph, invisible to callers."""
import pytest
import torch
from torch_geometric.nn import GCNConv, SAGEConv

import lightning_fullgraph.kernels as K
from lightning_fullgraph.kernels import locality

from kernel_testutils import cpp_or_skip


def shuffled_grid(side=40, deg=6, seed=0):
    """Edges between nearby cells of a side x side torus, node ids shuffled: locality hidden."""
    g = torch.Generator().manual_seed(seed)
    n = side * side
    dst = torch.arange(n).repeat_interleave(deg)
    dx = torch.randint(-2, 3, (n * deg,), generator=g)
    dy = torch.randint(-2, 3, (n * deg,), generator=g)
    src = ((dst // side + dy) % side) * side + (dst % side + dx) % side
    return torch.randperm(n, generator=g)[torch.stack([src, dst])], n


@pytest.fixture
def small_window(monkeypatch):
    # The test graphs are small: a window of 64 rows and no size floor make them "large".
    monkeypatch.setattr(locality, "WINDOW", 64)
    monkeypatch.setattr(locality, "MIN_EDGES", 0)
    monkeypatch.setattr(locality.locality_score, "__defaults__", (64,))
    yield
    K.set_locality(None)
    K.clear_memos()


def _order(ei, n, mode):
    csr = K.build_csr(ei, n, n)
    return locality.choose_order(ei[0], ei[1], csr.rowptr, csr.col, csr.t_rowptr, csr.t_col, n, mode)


def test_bfs_order_recovers_hidden_locality(small_window):
    ei, n = shuffled_grid()
    order = _order(ei, n, "auto")
    assert order is not None and order.method == "bfs"
    assert order.score_before < 0.2 and order.score_after > order.score_before + locality.MIN_GAIN
    assert torch.equal(order.perm[order.inv], torch.arange(n))
    assert torch.equal(torch.sort(order.perm).values, torch.arange(n))


def test_auto_keeps_random_and_local_graphs(small_window):
    n = 1600
    g = torch.Generator().manual_seed(1)
    random = torch.randint(0, n, (2, 6 * n), generator=g)
    assert _order(random, n, "auto") is None  # nothing to recover
    assert _order(random, n, "bfs") is not None  # forced
    ei, _ = shuffled_grid(side=40)
    order = _order(ei, n, "bfs")
    local = order.inv[ei]  # already in a local order
    assert _order(local, n, "auto") is None
    assert _order(ei, n, "off") is None


def test_size_floor_and_modes(monkeypatch):
    ei, n = shuffled_grid()
    assert _order(ei, n, "auto") is None  # 9.6k edges < MIN_EDGES: left alone
    with pytest.raises(ValueError, match="locality mode"):
        K.set_locality("fast")
    monkeypatch.setenv(locality.ENV, "off")
    K.set_locality(None)  # the environment is read again (else once, at the first query)
    assert K.get_locality() == "off"
    K.set_locality("bfs")
    assert K.get_locality() == "bfs"  # an explicit choice beats the environment
    monkeypatch.setenv(locality.ENV, "sometimes")
    K.set_locality(None)
    with pytest.raises(ValueError, match="LIGHTNING_FULLGRAPH_LOCALITY"):
        K.get_locality()
    monkeypatch.delenv(locality.ENV)
    K.set_locality(None)
    assert K.get_locality() == "auto"
    with pytest.raises(ValueError, match="locality mode"):
        _order(ei, n, "fast")


@pytest.mark.parametrize("backend", ["cpp", "torch"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
def test_reordered_aggregation_equals_own_order(small_window, backend, reduce):
    if backend == "cpp":
        cpp_or_skip()
    ei, n = shuffled_grid()
    x = torch.randn(n, 16, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    g = torch.randn(n, 16, dtype=torch.float64)
    results = {}
    for mode in ("off", "bfs"):
        K.set_locality(mode)
        K.clear_memos()
        out = K.aggregate(x, ei, w, reduce, n, backend=backend)
        assert (K.get_csr(ei, n, n).order is not None) == (mode == "bfs")
        gx, gw = torch.autograd.grad(out, (x, w), g)
        results[mode] = (out, gx, gw)
    # Forward: every row sums its edges in input order in both numberings (bit for bit);
    # backward sums a source's edges in another order: rounding only.
    assert torch.equal(results["off"][0], results["bfs"][0])
    for a, b in zip(results["off"][1:], results["bfs"][1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def with_halo(ei, n, num_halo=200, num_edges=600, seed=5):
    """A partition's graph: sources are the n owned rows then halo rows, destinations owned."""
    g = torch.Generator().manual_seed(seed)
    halo = torch.stack([n + torch.randint(0, num_halo, (num_edges,), generator=g),
                        torch.randint(0, n, (num_edges,), generator=g)])
    return torch.cat([ei, halo], 1), n + num_halo


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_partition_graph_ordered_on_its_owned_rows(small_window, backend):
    if backend == "cpp":
        cpp_or_skip()
    grid, n = shuffled_grid()
    ei, n_src = with_halo(grid, n)
    order = _order_rect(ei, n_src, n, "auto")
    assert order is not None and order.score_after > order.score_before + locality.MIN_GAIN
    # owned rows reordered, halo rows where they were
    assert torch.equal(order.src_perm[:n], order.perm) and torch.equal(order.src_perm[n:], torch.arange(n, n_src))
    x = torch.randn(n_src, 8, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.size(1), dtype=torch.float64, requires_grad=True)
    results = {}
    for mode in ("off", "bfs"):
        K.set_locality(mode)
        K.clear_memos()
        out = K.aggregate(x, ei, w, "sum", n, backend=backend)
        assert (K.get_csr(ei, n_src, n).order is not None) == (mode == "bfs")
        results[mode] = (out, *torch.autograd.grad(out.square().sum(), (x, w)))
    assert torch.equal(results["off"][0], results["bfs"][0])
    for a, b in zip(results["off"][1:], results["bfs"][1:]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_graphs_with_fewer_sources_keep_their_order(small_window):
    K.set_locality("bfs")
    ei, n = shuffled_grid()
    assert K.get_csr(ei, n, n).order is not None
    keep = ei[0] < n - 5
    assert K.get_csr(ei[:, keep], n - 5, n).order is None  # N_src < N_dst: no leading square


def test_bipartite_ids_unrelated_find_nothing(small_window):
    # Sources and destinations that are different node sets in unrelated ids: the leading-square
    # reading of the ids finds no locality, and "auto" keeps the graph's order.
    ei, n = shuffled_grid()
    g = torch.Generator().manual_seed(9)
    relabel = torch.randperm(n, generator=g)
    bip = torch.stack([relabel[ei[0]], ei[1]])
    assert _order_rect(bip, n, n, "auto") is None


def _order_rect(ei, n_src, n_dst, mode):
    csr = K.build_csr(ei, n_src, n_dst)
    return locality.choose_order(ei[0], ei[1], csr.rowptr, csr.col, csr.t_rowptr, csr.t_col, n_dst, mode,
                                 num_src=n_src)


@pytest.mark.parametrize("conv", [GCNConv, SAGEConv])
def test_pyg_layers_unchanged_by_reordering(small_window, conv):
    cpp_or_skip()
    ei, n = shuffled_grid()
    torch.manual_seed(0)
    layer = conv(8, 8)
    x = torch.randn(n, 8, requires_grad=True)
    ref = layer(x, ei)
    (gref,) = torch.autograd.grad(ref.square().sum(), x)
    K.set_locality("bfs")
    with K.use("cpp"):
        out = layer(x, ei)
        (gout,) = torch.autograd.grad(out.square().sum(), x)
    assert K.get_csr(ei, n, n).order is not None or conv is GCNConv  # GCN adds self-loops first
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gout, gref, rtol=1e-5, atol=1e-5)


def test_expansion_tells_random_from_local_graphs(monkeypatch):
    ei, n = shuffled_grid(side=60, deg=8)
    csr = K.build_csr(ei, n, n)
    local = locality.expansion(csr.rowptr, csr.col, n)
    g = torch.Generator().manual_seed(2)
    rnd = K.build_csr(torch.randint(0, n, (2, ei.size(1)), generator=g), n, n)
    random = locality.expansion(rnd.rowptr, rnd.col, n)
    assert local < 0.3 < locality.MAX_EXPANSION < random
    # "auto" does not even try a breadth-first order on the random graph (it would cost as much as the CSR)
    monkeypatch.setattr(locality, "MIN_EDGES", 0)
    monkeypatch.setattr(locality, "bfs_order", lambda *a: pytest.fail("an order computed for a random graph"))
    rsrc = rnd.col.long()
    rdst = torch.repeat_interleave(torch.arange(n), rnd.rowptr[1:] - rnd.rowptr[:-1])
    assert locality.choose_order(rsrc, rdst, rnd.rowptr, rnd.col, rnd.t_rowptr, rnd.t_col, n, "auto") is None
